"""Calibration of the acceptance rules on simulated candidates of KNOWN true effect (scripted, no model).

    PYTHONPATH=src .venv/bin/python benchmarks/acceptance_calibration.py [--reps 1000] [--batch 8] [--seed 0]
        [--null-reps 0]

About 15 minutes at --reps 1000 on a shared 2-core machine (3 minutes at --reps 200); --null-reps N adds a
check of the sequential rule's false-accept rate on N candidates of no effect per cell.

A pool of 2000 tasks with realistic base rates and per-task heterogeneity, in three regimes:
- deterministic: temperature 0, one trial; 45% of tasks pass; a candidate flips tasks (any edit breaks ~5% of
  the tasks, so a true effect d gains 5% + d and loses 5%; a negative effect loses 5% - d and gains 5%);
- stochastic: temperature > 0 / a user simulator, one trial; per-task pass rates ~ Beta(0.6, 0.7) (mean 0.46,
  many tasks near 0 or 1); the candidate shifts each task's logit by b + u, u ~ N(0, 0.7^2) (it helps some tasks
  and hurts others), b set so the pool's mean pass rate moves by exactly d;
- stochastic x3: the same with three trials per task.
True effects d: -0.1, 0, +0.05, +0.1, +0.2 (the pool mean of candidate - current). For each candidate, val
tasks are drawn from the pool (sizes 8, 16, 32, 64, nested: common random numbers across sizes and rules), and
every rule decides through `accept.validate_in_batches` (the rule objects, batched as the engine batches:
`train.engine.eval_batch` tasks per batch, the stop predicate asked before each batch after the first).

Rules: sequential (alpha 0.05, looks every batch, futility 0.1), sequential one-look (the same exact test on a
fixed-size evaluation), strict / tolerance (early-stopped when the rejection is certain), noise-aware.
Reported: the acceptance rate per true effect (at d <= 0 it is the false-accept rate, at d > 0 the power) and
the mean candidate episodes per decision (the current harness's N x trials val episodes are the same for every
rule and are measured once per current harness). Then the sequential rule against a fixed-size evaluation of
the same power: the smallest fixed val size whose one-look exact test reaches the sequential rule's power.

Writes benchmarks/results/acceptance-calibration/{calibration.md, calibration.json}.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np

from ecdysis.trainer.accept import AcceptanceRule, ClassicRule, validate_in_batches
from ecdysis.trainer.sequential import SequentialRule

POOL = 2000
EFFECTS = (-0.1, 0.0, 0.05, 0.1, 0.2)
SIZES = (8, 16, 32, 64)
FIXED_SIZES = tuple(range(4, 129, 4))
ALPHA = 0.05
OUT = Path(__file__).resolve().parent / "results" / "acceptance-calibration"


def rules() -> dict[str, tuple[AcceptanceRule, bool]]:
    """name -> (rule, batched: looks after every batch; False: one look at the end)."""
    return {"sequential": (SequentialRule(ALPHA), True), "sequential one-look": (SequentialRule(ALPHA), False),
            "strict": (ClassicRule("strict"), True), "tolerance 0.05": (ClassicRule("tolerance", 0.05), True),
            "noise-aware": (ClassicRule("noise-aware"), True)}


class Regime:
    """A task pool and how candidates of a given true effect are drawn on it."""

    def __init__(self, name: str, trials: int, rng: np.random.Generator) -> None:
        self.name, self.trials, self.rng = name, trials, rng
        if name == "deterministic":
            self.p = (rng.random(POOL) < 0.45).astype(float)
        else:
            self.p = rng.beta(0.6, 0.7, POOL)

    def candidate(self, effect: float) -> np.ndarray:
        """Per-task pass probabilities of a fresh candidate whose pool mean differs from the current's by `effect`."""
        rng, p = self.rng, self.p
        if self.name == "deterministic":
            gain, loss = 0.05 + max(effect, 0.0), 0.05 - min(effect, 0.0)
            q = p.copy()
            failing, passing = np.flatnonzero(p == 0), np.flatnonzero(p == 1)
            q[rng.choice(failing, round(gain * POOL), replace=False)] = 1.0
            q[rng.choice(passing, round(loss * POOL), replace=False)] = 0.0
            return q
        logit = np.log(np.clip(p, 1e-4, 1 - 1e-4) / (1 - np.clip(p, 1e-4, 1 - 1e-4)))
        u = rng.normal(0.0, 0.7, POOL)
        lo, hi = -10.0, 10.0
        for _ in range(60):  # the shift b that moves the pool mean by exactly `effect`
            b = (lo + hi) / 2
            q = 1 / (1 + np.exp(-(logit + b + u)))
            lo, hi = (b, hi) if q.mean() - p.mean() < effect else (lo, b)
        return q

    def scores(self, prob: np.ndarray) -> list[list[float]]:
        if self.name == "deterministic":
            return [[float(x)] * self.trials for x in prob]
        return (self.rng.random((len(prob), self.trials)) < prob[:, None]).astype(float).tolist()


def run(reps: int, batch: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    table = rules()
    regimes = [Regime("deterministic", 1, rng), Regime("stochastic", 1, rng), Regime("stochastic x3", 3, rng)]
    cells: dict = {}
    fixed: dict = {}
    for regime in regimes:
        for effect in EFFECTS:
            accepted = {(r, n): 0 for r in table for n in SIZES}
            episodes = {(r, n): 0 for r in table for n in SIZES}
            fixed_accepted = dict.fromkeys(FIXED_SIZES, 0)
            one_look = SequentialRule(ALPHA)
            for _ in range(reps):
                q = regime.candidate(effect)
                val = rng.choice(POOL, max(FIXED_SIZES), replace=False)
                current = dict(zip(map(str, val), regime.scores(regime.p[val]), strict=True))
                candidate = dict(zip(map(str, val), regime.scores(q[val]), strict=True))
                ids = [str(v) for v in val]
                for n in SIZES:
                    expected = ids[:n]
                    for name, (rule, batched) in table.items():
                        d, spent = validate_in_batches(rule, current, candidate, expected, batch if batched else None,
                                                       trials=regime.trials)
                        accepted[name, n] += d.accepted
                        episodes[name, n] += spent
                for n in FIXED_SIZES:
                    d, _ = validate_in_batches(one_look, current, candidate, ids[:n], None, trials=regime.trials)
                    fixed_accepted[n] += d.accepted
            for (name, n), a in accepted.items():
                cells.setdefault(regime.name, {}).setdefault(name, {}).setdefault(str(n), {})[str(effect)] = {
                    "accept_rate": a / reps, "episodes": episodes[name, n] / reps}
            fixed.setdefault(regime.name, {})[str(effect)] = {str(n): a / reps for n, a in fixed_accepted.items()}
            print(f"{regime.name} effect {effect:+.2f} done", flush=True)
    return {"reps": reps, "batch": batch, "seed": seed, "alpha": ALPHA, "pool": POOL, "effects": list(EFFECTS),
            "sizes": list(SIZES), "cells": cells, "fixed_power": fixed}


def null_check(reps: int, batch: int, seed: int) -> dict:
    """The sequential rule's false-accept rate on more candidates of no effect: `sharp` (the candidate's episodes
    are draws of the current harness's: an identical copy) and `weak` (per-task effects that cancel on the pool)."""
    rng = np.random.default_rng(seed + 1)
    rule = SequentialRule(ALPHA)
    out: dict = {}
    for regime in (Regime("stochastic", 1, rng), Regime("stochastic x3", 3, rng), Regime("deterministic", 1, rng)):
        for null in ("sharp", "weak"):
            accepted = {(n, looks): 0 for n in (32, 64) for looks in ("batched", "one-look")}
            for _ in range(reps):
                q = regime.p if null == "sharp" else regime.candidate(0.0)
                val = rng.choice(POOL, 64, replace=False)
                current = dict(zip(map(str, val), regime.scores(regime.p[val]), strict=True))
                candidate = dict(zip(map(str, val), regime.scores(q[val]), strict=True))
                ids = [str(v) for v in val]
                for n, looks in accepted:
                    d, _ = validate_in_batches(rule, current, candidate, ids[:n], batch if looks == "batched" else None,
                                               trials=regime.trials)
                    accepted[n, looks] += d.accepted
            out.setdefault(regime.name, {})[null] = {f"{n} {looks}": a / reps for (n, looks), a in accepted.items()}
            print(f"null check {regime.name} {null} done", flush=True)
    return out


def null_markdown(check: dict, reps: int) -> str:
    lines = [f"## False-accept check ({reps} candidates of no effect per cell; sequential, alpha {ALPHA})", "",
             "sharp: the candidate's episodes are draws of the current harness's (an identical copy); weak: per-task "
             f"effects that cancel on the pool. Standard error at 0.05: {math.sqrt(0.05 * 0.95 / reps):.4f}.", "",
             "| regime | null | 32 batched | 32 one-look | 64 batched | 64 one-look |", "|---|---|---:|---:|---:|---:|"]
    for regime, by_null in check.items():
        for null, cell in by_null.items():
            lines.append(f"| {regime} | {null} | " + " | ".join(
                f"{cell[k]:.4f}" for k in ("32 batched", "32 one-look", "64 batched", "64 one-look")) + " |")
    return "\n".join(lines) + "\n"


def se(rate: float, reps: int) -> float:
    return math.sqrt(max(rate * (1 - rate), 1e-9) / reps)


def markdown(result: dict) -> str:
    reps, effects = result["reps"], result["effects"]
    lines = [f"# Acceptance calibration ({reps} candidates per cell, val batches of {result['batch']}, "
             f"alpha {result['alpha']})", "",
             "Acceptance rate per true effect: at -0.1 and 0 it is the false-accept rate, above 0 the power. "
             "Episodes: mean candidate val episodes per decision (trials included), at effect 0 and at +0.2. "
             f"Standard error of a rate r: sqrt(r(1-r)/{reps}) (0.007 at r = 0.05).", ""]
    for regime, by_rule in result["cells"].items():
        lines += [f"## {regime}", "",
                  "| rule | val | " + " | ".join(f"{e:+.2f}" for e in effects) + " | episodes @0 | episodes @+0.2 |",
                  "|---|---:|" + "---:|" * len(effects) + "---:|---:|"]
        for name, by_size in by_rule.items():
            for n, cell in by_size.items():
                rates = " | ".join(f"{cell[str(e)]['accept_rate']:.3f}" for e in effects)
                lines.append(f"| {name} | {n} | {rates} | {cell['0.0']['episodes']:.1f} | "
                             f"{cell['0.2']['episodes']:.1f} |")
        lines += ["", "Sequential vs a fixed-size evaluation of the same power (the smallest fixed val size whose "
                  "one-look exact test reaches the sequential rule's power; episodes per candidate):", "",
                  "| val (sequential) | effect | power | episodes @effect | episodes @0 | fixed size | fixed power | "
                  "fixed episodes |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
        trials = 3 if regime.endswith("x3") else 1
        for n, cell in by_rule["sequential"].items():
            for e in effects:
                power = cell[str(e)]["accept_rate"]
                if e <= 0 or power < 0.2:
                    continue
                curve = result["fixed_power"][regime][str(e)]
                match = next((int(m) for m, p in curve.items() if p >= power), None)
                fixed_txt = (f"{match} | {curve[str(match)]:.3f} | {match * trials}" if match is not None
                             else "> 128 | – | –")
                lines.append(f"| {n} | {e:+.2f} | {power:.3f} | {cell[str(e)]['episodes']:.1f} | "
                             f"{cell['0.0']['episodes']:.1f} | {fixed_txt} |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=8, help="tasks per val batch (the engine's default: 4 x "
                                                              "run.concurrency = 8)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--null-reps", type=int, default=0, help="also check the sequential rule's false-accept "
                                                                   "rate on this many no-effect candidates per cell")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    start = time.perf_counter()
    result = run(args.reps, args.batch, args.seed)
    text = markdown(result)
    if args.null_reps:
        result["null_check"] = null_check(args.null_reps, args.batch, args.seed)
        result["null_reps"] = args.null_reps
        text += "\n" + null_markdown(result["null_check"], args.null_reps)
    result["wall_s"] = round(time.perf_counter() - start, 1)
    command = (f"PYTHONPATH=src .venv/bin/python benchmarks/acceptance_calibration.py --reps {args.reps} "
               f"--batch {args.batch} --seed {args.seed} --null-reps {args.null_reps}")
    text += f"\nWall time {result['wall_s']} s. Command: `{command}`\n"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "calibration.json").write_text(json.dumps(result, indent=1))
    (args.out / "calibration.md").write_text(text)
    print(text)
    print(f"written {args.out}/calibration.md and calibration.json ({result['wall_s']} s)")


if __name__ == "__main__":
    main()
