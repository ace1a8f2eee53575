"""The factorial table of a compare (`compare-summary --target`): per arm, over its seeds, the charged time to a
pre-registered val accuracy (misses censored at the budget, restricted mean), the AUC of the val-accuracy curve
over charged time, test accuracy as paired per-task differences against `serial` (and `serial+library` when
it ran), the speed-up against them, and tokens. The statistics are `compare/stats.py`'s; docs/claim.md says
how to read them.
"""

from __future__ import annotations

import json
import math
import tomllib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from rich.table import Table

from .files import rate_tables
from .results import TRAINED, ArmResult, score, time_of
from .stats import (
    Estimate,
    auc,
    mean_estimate,
    mean_p,
    paired_estimate,
    rmst_estimate,
    speedup_estimate,
    speedup_p,
    time_to_target,
)

REFERENCES = ("serial", "serial+library")  # the per-failure arms the claim is measured against
# one factor at a time: (factor, arm with it, arm without it; the two differ in that factor alone)
FACTORS = (("library", "serial+library", "serial"), ("aggregation", "aggregate", "serial+library"),
           ("debate", "ecdysis", "aggregate"))


@dataclass
class FactorRow:
    """One factor's effect: the arm with it against the arm without it, paired over the seeds both ran."""

    factor: str
    arm: str
    without: str
    speedup: Estimate | None  # RMST(without) / RMST(arm): > 1, the factor reaches the target sooner
    auc_diff: Estimate | None  # AUC(arm) - AUC(without), per seed
    test_diff: Estimate | None  # paired per-task test difference arm - without
    seeds: int = 0  # the seeds both arms ran: what the three are paired over
    speedup_p: float | None = None  # one-sided exact sign-flip p over seeds (stats.py), reported beside the rule
    auc_p: float | None = None


@dataclass(frozen=True)
class Registration:
    """What was fixed before any arm ran: the target val accuracy, the budget (charged seconds), and the
    decision's thresholds (compare/verdict.py; the designed suite's by default)."""

    target: float
    budget_s: float | None = None
    min_speedup: float = 2.0  # the claim holds at a speed-up of at least this, its interval above 1
    test_margin: float = 0.05  # ... and the paired test difference's interval above -test_margin
    seeds: int | None = None  # the registered number of seeds: a contrast over fewer is interim, not decided

    @classmethod
    def resolve(cls, target: float | None, budget_s: float | None,
                registered: Registration | None) -> Registration | None:
        """The command line's target and budget, each defaulting to the registration file's (`read`); None: no
        target."""
        if target is None and registered is None:
            return None
        base = registered if registered is not None else cls(target)  # type: ignore[arg-type]
        return replace(base, target=target if target is not None else base.target,
                       budget_s=budget_s if budget_s is not None else base.budget_s)

    def departures(self, registered: Registration | None) -> list[str]:
        """What this plan changes of the registration file's values (a command-line override), said plainly."""
        if registered is None:
            return []
        return [f"{name} {new:g} instead of the registered {old:g}" for name, new, old in
                (("target", self.target, registered.target), ("budget_s", self.budget_s, registered.budget_s))
                if old is not None and new is not None and new != old]

    @classmethod
    def read(cls, path: Path) -> Registration:
        """From a TOML file with `target` (and optionally `budget_s`); ValueError naming the file otherwise."""
        try:
            data = tomllib.loads(path.read_text())
            target = float(data["target"])
            budget = data.get("budget_s")
            rule = {k: data[k] for k in ("min_speedup", "test_margin") if k in data}
            unknown = set(data) - {"target", "budget_s", "min_speedup", "test_margin", "seeds"}
            if unknown:
                raise ValueError(f"unknown keys {sorted(unknown)}")
            if not all(type(v) in (int, float) and math.isfinite(v) for v in rule.values()) or \
                    rule.get("min_speedup", 1) <= 0 or rule.get("test_margin", 0) < 0:
                raise ValueError("min_speedup must be a number > 0 and test_margin a number >= 0")
            seeds = data.get("seeds")
            if seeds is not None and (type(seeds) is not int or seeds < 1):
                raise ValueError(f"seeds must be a whole number >= 1 (got {seeds!r})")
            rule = {k: float(v) for k, v in rule.items()}
            return cls(target, float(budget) if budget is not None else None, seeds=seeds, **rule)
        except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path}: not a registration file ({exc!r}); it needs `target = <val accuracy>` and "
                             "may set `budget_s = <charged seconds>`, `min_speedup`, `test_margin`, `seeds`") from None


@dataclass
class FactorialRow:
    arm: str
    seeds: int
    reached: int | None = None  # seeds whose curve reached the target within the budget
    time_to_target: Estimate | None = None  # restricted mean charged seconds, misses censored at the budget
    auc: Estimate | None = None  # time-averaged val accuracy on [0, budget]
    test_acc: Estimate | None = None
    test_vs: dict[str, Estimate | None] | None = None  # reference arm -> paired test difference
    speedup_vs: dict[str, Estimate | None] | None = None  # reference arm -> RMST ratio
    paired_seeds: dict[str, int] | None = None  # reference arm -> seeds both ran (what test_vs, speedup_vs pair)
    speedup_p_vs: dict[str, float | None] | None = None  # reference arm -> the speed-up's sign-flip p (stats.py)
    tokens: Estimate | None = None  # training tokens a cold run spends (best-of-k: its samples)
    time_parts: dict[str, float] | None = None  # where the charged seconds went: mean over seeds (`time_parts`)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def points(result: ArmResult) -> list[tuple[float, float | None]]:
    """(charged s, val accuracy) per curve point: the target is a val accuracy, so a point without a val score
    reaches nothing (never its train score instead)."""
    return [(time_of(p), score(p, "val")) for p in result.curve]


def by_arm_and_seed(results: list[ArmResult]) -> dict[str, dict[int, ArmResult]]:
    """arm -> seed -> its result, arms in run order."""
    by_arm: dict[str, dict[int, ArmResult]] = {}
    for r in results:
        by_arm.setdefault(r.arm, {})[r.seed] = r
    return by_arm


def time_parts(result: ArmResult) -> dict[str, float] | None:
    """An arm's charged seconds by part: the seed evaluation (its curve's step 0, the same for every arm of a
    seed), the episodes of its other evaluations (agent calls and sandbox), each optimizer role's calls."""
    if not result.charged_parts:
        return None
    parts = dict(result.charged_parts)
    seed = next((p.charged_s or 0.0 for p in result.curve if p.step == 0), 0.0)
    episodes = parts.pop("agent", 0.0) + parts.pop("user", 0.0) + parts.pop("sandbox", 0.0)
    return {"seed evaluation": seed, "candidate episodes": max(episodes - seed, 0.0), **parts}


def mean_parts(runs: list[ArmResult]) -> dict[str, float] | None:
    """`time_parts` averaged over the seeds that have them (a part a seed lacks counts 0 there)."""
    found = [p for r in runs if (p := time_parts(r)) is not None]
    names = list(dict.fromkeys(name for p in found for name in p))
    return {name: sum(p.get(name, 0.0) for p in found) / len(found) for name in names} if found else None


def budget_of(results: list[ArmResult], given: float | None) -> tuple[float, str]:
    """The censoring time τ: the given one, else the arms' recorded budget, else the longest curve (said so)."""
    if given is not None:
        return given, "registered"
    recorded = {r.budget_s for r in results if r.budget_s is not None}
    if len(recorded) == 1:
        return recorded.pop(), "train.budget.wall_s"
    longest = max((time_of(p) for r in results for p in r.curve), default=0.0)
    return longest, "no single recorded budget: the longest curve's end"


def factorial(results: list[ArmResult], target: float, budget_s: float | None = None, reps: int = 2000,
              seed: int = 0, p_values: bool = True) -> tuple[list[FactorialRow], float, str]:
    """One row per arm (in run order), the censoring time τ used and where it came from (`p_values`: with each
    speed-up's sign-flip p, which no decision reads)."""
    tau, source = budget_of(results, budget_s)
    by_arm = by_arm_and_seed(results)
    obs = {arm: {s: time_to_target(points(r), target, tau) for s, r in runs.items() if r.curve}
           for arm, runs in by_arm.items() if arm in TRAINED or any(r.curve for r in runs.values())}
    tests = {arm: {s: r.test_per_task for s, r in runs.items() if r.test_per_task} for arm, runs in by_arm.items()}
    refs = [a for a in REFERENCES if a in by_arm]
    rows = []
    for arm, runs in by_arm.items():
        row = FactorialRow(arm, len(runs))
        row.test_acc = mean_estimate([r.test_acc for r in runs.values()], reps, seed)
        row.tokens = mean_estimate([float(r.training_tokens()) for r in runs.values()], reps, seed)
        if arm_obs := obs.get(arm):
            row.reached = sum(o.reached for o in arm_obs.values())
            row.time_to_target = rmst_estimate(list(arm_obs.values()), tau, reps, seed)
            aucs = [a for r in runs.values() if r.curve and (a := auc(points(r), tau)) is not None]
            row.auc = mean_estimate(aucs, reps, seed)
            row.speedup_vs = {ref: speedup_estimate(obs.get(ref, {}), arm_obs, tau, reps, seed)
                              for ref in refs if ref != arm and ref in obs}
            if p_values:
                row.speedup_p_vs = {ref: speedup_p(obs[ref], arm_obs, tau, reps, seed) for ref in row.speedup_vs}
        row.test_vs = {ref: paired_estimate(tests[arm], tests[ref], reps, seed) for ref in refs if ref != arm}
        row.paired_seeds = {ref: len(set(runs) & set(by_arm[ref])) for ref in refs if ref != arm}
        row.time_parts = mean_parts(list(runs.values()))
        rows.append(row)
    return rows, tau, source


def factor_rows(results: list[ArmResult], target: float, tau: float, reps: int = 2000,
                seed: int = 0, p_values: bool = True) -> list[FactorRow]:
    """The library, aggregation and debate contrasts (`FACTORS`) between the arms that ran, paired by seed
    (`p_values`: with their sign-flip p, which no decision reads)."""
    by_arm = by_arm_and_seed(results)
    rows = []
    for factor, arm, without in FACTORS:
        if arm not in by_arm or without not in by_arm:
            continue
        a, b = by_arm[arm], by_arm[without]
        obs = {name: {s: time_to_target(points(r), target, tau) for s, r in runs.items() if r.curve}
               for name, runs in ((arm, a), (without, b))}
        both = sorted(set(a) & set(b))
        aucs = [x - y for s in both if (x := auc(points(a[s]), tau)) is not None
                and (y := auc(points(b[s]), tau)) is not None]
        tests = [{s: r.test_per_task for s, r in runs.items() if r.test_per_task} for runs in (a, b)]
        rows.append(FactorRow(factor, arm, without, speedup_estimate(obs[without], obs[arm], tau, reps, seed),
                              mean_estimate(aucs, reps, seed), paired_estimate(tests[0], tests[1], reps, seed),
                              len(both), speedup_p(obs[without], obs[arm], tau, reps, seed) if p_values else None,
                              mean_p(aucs, reps, seed) if p_values else None))
    return rows


@dataclass(frozen=True)
class EarlyStop:
    """A training arm that ended before the budget τ for another reason (a round limit, a token guard, a run of
    rejections): the registered stop rule is the budget alone, so its row is not under the same rule as the others
    (a miss is still censored at τ, and its last val accuracy holds to τ in the AUC)."""

    arm: str
    seed: int
    charged_s: float
    reason: str
    reached: bool  # whether it reached the target before it stopped (then its time to target is unaffected)

    def text(self, tau: float) -> str:
        after = "after reaching the target" if self.reached else "without reaching the target"
        return (f"{self.arm} seed {self.seed}: stopped at {self.charged_s:.0f} of {tau:.0f} charged s, {after}: "
                f"{self.reason or 'no stop reason recorded'}")


def early_stops(results: list[ArmResult], target: float, tau: float) -> list[EarlyStop]:
    """The training arms (with a curve and charged time) that stopped before τ, in run order."""
    return [EarlyStop(r.arm, r.seed, r.train_charged_s, r.stop_reason,
                      time_to_target(points(r), target, tau).reached)
            for r in results if r.curve and r.train_charged_s is not None and r.train_charged_s < tau - 1e-6]


@dataclass
class FactorialReport:
    """The factorial rows of a result set under a registration, and the censoring time they used."""

    registration: Registration
    rows: list[FactorialRow]
    tau: float
    source: str
    factors: list[FactorRow]
    rates: str = "not recorded"  # the rate table(s) the charged seconds come from
    early: list[EarlyStop] = field(default_factory=list)  # arms stopped before τ by another rule

    def table(self) -> Table:
        return factorial_table(self.rows, self.registration.target, self.tau, self.source, self.rates)

    def time_table(self) -> Table | None:
        return time_parts_table(self.rows)

    def factor_table(self) -> Table | None:
        return factor_table(self.factors) if self.factors else None

    def write(self, path: Path, **extra: object) -> None:
        path.write_text(json.dumps({"target": self.registration.target, "budget_s": self.tau,
                                    "budget_source": self.source, "rates_version": self.rates,
                                    "rows": [r.to_dict() for r in self.rows],
                                    "factors": [asdict(f) for f in self.factors],
                                    "early_stops": [asdict(e) for e in self.early], **extra}, indent=1))

    def early_text(self) -> str | None:
        """A warning naming every arm that stopped before the budget (None: every arm ran to it)."""
        if not self.early:
            return None
        return ("Stopped before the budget τ by another rule (the registered stop rule is the "
                "budget alone; a miss is censored at τ and its last val accuracy holds to τ in the AUC):\n"
                + "\n".join(f"  {e.text(self.tau)}" for e in self.early))


def factorial_report(results: list[ArmResult], registration: Registration) -> FactorialReport:
    rows, tau, source = factorial(results, registration.target, registration.budget_s)
    return FactorialReport(registration, rows, tau, source, factor_rows(results, registration.target, tau),
                           ", ".join(rate_tables(results)) or "not recorded",
                           early_stops(results, registration.target, tau))


def _cell(e: Estimate | None, digits: int = 3, signed: bool = False) -> str:
    return "–" if e is None else e.text(digits, signed)


def _p(p: float | None) -> str:
    return "–" if p is None else f"{p:.3f}"


def _paired(e: Estimate | None, shared: int | None, seeds: int, digits: int = 3, signed: bool = False) -> str:
    """A paired cell, naming the seeds it pairs over when they are fewer than the row's own."""
    text = _cell(e, digits, signed)
    return text if e is None or shared is None or shared >= seeds else f"{text} ({shared} of {seeds} seeds)"


def factorial_table(rows: list[FactorialRow], target: float, tau: float, source: str,
                    rates: str = "not recorded") -> Table:
    refs = sorted({ref for r in rows for ref in {**(r.test_vs or {}), **(r.speedup_vs or {})}},
                  key=lambda a: REFERENCES.index(a) if a in REFERENCES else 99)
    table = Table(title=f"Factorial table: val target {target:g}, budget τ = {tau:.0f} charged s ({source}; rate "
                        f"table {rates}); mean [95% bootstrap interval] over seeds")
    for name in ("arm", "seeds", "reached", "charged s to target (censored, RMST)", "AUC val/τ", "test acc"):
        table.add_column(name, justify="left" if name == "arm" else "right")
    for ref in refs:
        table.add_column(f"test − {ref} (paired)", justify="right")
        table.add_column(f"speed-up vs {ref}", justify="right")
    table.add_column("tokens", justify="right")
    for r in rows:
        reached = "–" if r.reached is None or r.time_to_target is None else f"{r.reached}/{r.time_to_target.n}"
        cells = [r.arm, str(r.seeds), reached, _cell(r.time_to_target, 0), _cell(r.auc), _cell(r.test_acc)]
        for ref in refs:
            shared = (r.paired_seeds or {}).get(ref)
            cells += [_paired((r.test_vs or {}).get(ref), shared, r.seeds, signed=True),
                      _paired((r.speedup_vs or {}).get(ref), shared, r.seeds, 2)]
        cells.append(_cell(r.tokens, 0))
        table.add_row(*cells)
    return table


def time_parts_table(rows: list[FactorialRow]) -> Table | None:
    """Where each training arm's charged time went, mean seconds per seed (None: no arm recorded its parts)."""
    shown = [r for r in rows if r.time_parts]
    if not shown:
        return None
    names = list(dict.fromkeys(name for r in shown for name in r.time_parts or {}))
    table = Table(title="Where the charged time went: mean charged s per seed (optimizer roles by name)")
    for name in ("arm", *names, "total"):
        table.add_column(name, justify="left" if name == "arm" else "right")
    for r in shown:
        parts = r.time_parts or {}
        table.add_row(r.arm, *(f"{parts[n]:.0f}" if n in parts else "–" for n in names), f"{sum(parts.values()):.0f}")
    return table


def factor_table(factors: list[FactorRow]) -> Table:
    """One row per factor: what adding it changes, paired over seeds (speed-up > 1: the target sooner)."""
    table = Table(title="Per factor: the arm with it against the arm without it, paired over seeds; "
                        "mean [95% bootstrap interval]; p: one-sided exact sign-flip test over seeds (no decision "
                        "reads it)")
    for name in ("factor", "arm vs without", "seeds", "speed-up to target", "p", "AUC difference", "p",
                 "test difference (paired)"):
        table.add_column(name, justify="left" if name in ("factor", "arm vs without") else "right")
    for f in factors:
        table.add_row(f.factor, f"{f.arm} vs {f.without}", str(f.seeds), _cell(f.speedup, 2), _p(f.speedup_p),
                      _cell(f.auc_diff, signed=True), _p(f.auc_p), _cell(f.test_diff, signed=True))
    return table
