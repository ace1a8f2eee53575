"""What the registered seeds may decide, projected from an interim pool (`compare-summary --project`): a guide
to what is still within reach, never a decision.

Each simulated completion keeps the seeds on which every arm ran and draws the ones still to run (up to the
registration's `seeds`) with replacement from them, every arm of a drawn seed together so the pairing holds; the
registered rules (`verdict.py`) are then applied to it as if decided. The projection is the share of
completions in which each contrast holds and each factor shows a gain. It assumes the seeds to come look like the
seeds that ran, so with few seeds it understates the spread: a share near 0 says a decision is out of reach unless
the coming seeds differ from the ones seen; a share near 1 is no promise.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field, replace

from rich.table import Table

from .factorial import REFERENCES, Registration, factor_rows, factorial
from .results import ArmResult
from .verdict import AGGREGATION_ARMS, claim_verdicts, default_method, factor_gains, overall

SIMS = 200  # simulated completions
REPS = 200  # bootstrap resamples per interval inside one completion (the decision itself uses 2000)


@dataclass(frozen=True)
class Projection:
    """Per contrast ("aggregate vs serial"), per aggregation arm's claim ("the claim, aggregate": it holds against
    every per-failure arm at once) and per factor, the share of simulated completions that decide it as holding /
    showing a gain."""

    seeds_run: int
    seeds_registered: int
    sims: int
    holds: dict[str, float]
    gains: dict[str, float]
    defaults: dict[str, float] = field(default_factory=dict)  # method -> share it is the default in

    def table(self) -> Table:
        table = Table(title=f"Projected at the registered {self.seeds_registered} seeds, from the {self.seeds_run} "
                            f"complete ones ({self.sims} completions drawing the missing seeds from those; a guide to "
                            "what is within reach, not a decision)")
        table.add_column("contrast or factor")
        table.add_column("share of completions where it holds / shows a gain", justify="right")
        for name, share in self.holds.items():
            table.add_row(name, f"{share:.2f}")
        for name, share in self.gains.items():
            table.add_row(f"factor: {name}", f"{share:.2f}")
        for method, share in self.defaults.items():
            table.add_row(f"the default method: {method}", f"{share:.2f}")
        return table

    def to_dict(self) -> dict[str, object]:
        return {"seeds_run": self.seeds_run, "seeds_registered": self.seeds_registered, "sims": self.sims,
                "holds": self.holds, "gains": self.gains, "defaults": self.defaults}


def complete_seeds(results: list[ArmResult]) -> list[ArmResult]:
    """The results of the seeds on which every arm the rules read (the per-failure and aggregation arms of the
    pool) ran; a seed still running is left out, an arm the rules do not read (`fixed`) is not waited for."""
    needed = {r.arm for r in results} & {*REFERENCES, *AGGREGATION_ARMS}
    ran: dict[int, set[str]] = {}
    for r in results:
        ran.setdefault(r.seed, set()).add(r.arm)
    return [r for r in results if needed <= ran[r.seed]]


def completion(results: list[ArmResult], registered: int, rng: random.Random) -> list[ArmResult]:
    """The seeds that ran, renumbered 0..n-1, then `registered - n` seeds drawn with replacement from them
    (each drawn seed's arms together), numbered on from n."""
    seeds = sorted({r.seed for r in results})
    drawn = seeds + [rng.choice(seeds) for _ in range(registered - len(seeds))]
    return [replace(r, seed=k) for k, s in enumerate(drawn) for r in results if r.seed == s]


def project(results: list[ArmResult], rule: Registration, sims: int = SIMS, reps: int = REPS,
            seed: int = 0) -> Projection | None:
    """From the complete seeds (`complete_seeds`). None when nothing is interim: no registered number of seeds,
    as many complete seeds as registered, or fewer than two to draw from."""
    results = complete_seeds(results)
    seeds_run = len({r.seed for r in results})
    if rule.seeds is None or seeds_run >= rule.seeds or seeds_run < 2:
        return None
    rng = random.Random(seed)
    holds: Counter[str] = Counter()
    gains: Counter[str] = Counter()
    defaults: Counter[str] = Counter()
    for sim in range(sims):
        sample = completion(results, rule.seeds, rng)
        rows, tau, _ = factorial(sample, rule.target, rule.budget_s, reps, sim, p_values=False)
        contrasts = claim_verdicts(rows, rule)
        for v in contrasts:
            holds[f"{v.arm} vs {v.against}"] += v.holds
        for arm, outcome, _ in overall(contrasts):
            holds[f"the claim, {arm}"] += outcome == "holds"
        rows = factor_rows(sample, rule.target, tau, reps, sim, p_values=False)
        by_factor = factor_gains(rows, rule)
        for factor, (gain, _) in by_factor.items():
            gains[factor] += gain
        if (default := default_method(by_factor)) is not None:
            defaults[default[0]] += 1
    return Projection(seeds_run, rule.seeds, sims, {k: n / sims for k, n in holds.items()},
                      {k: n / sims for k, n in gains.items()}, {k: n / sims for k, n in sorted(defaults.items())})
