"""Time to target at other targets (`compare-summary --sensitivity 0.4,0.45,...`): post hoc, never the decision.

The registered target decides the claim (`verdict.py`). A reviewer still asks whether a conclusion rests on where
that target was set: a target above what any arm can reach on most seeds censors every arm at τ there, and the
RMST ratio is then bounded near (k·τ + T_ref) / (k·τ + T_arm) however fast an arm is (docs/claim.md). This table
repeats the time-to-target contrasts at each given val target, with the same censoring at τ, the same pairing over
seeds and the same bootstrap as the factorial table; the registered target's row is marked.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from rich.table import Table

from .factorial import FACTORS, REFERENCES, by_arm_and_seed, points
from .results import ArmResult
from .stats import Estimate, TimeToTarget, speedup_estimate, time_to_target
from .verdict import AGGREGATION_ARMS


def contrasts(arms: set[str]) -> list[tuple[str, str]]:
    """(arm, reference) pairs among the arms that ran: each aggregation arm against each per-failure arm, then the
    factors that are not already among those (the library, the debate)."""
    pairs = [(arm, ref) for arm in AGGREGATION_ARMS for ref in REFERENCES if {arm, ref} <= arms]
    pairs += [(arm, without) for _, arm, without in FACTORS if {arm, without} <= arms and (arm, without) not in pairs]
    return pairs


@dataclass(frozen=True)
class SensitivityRow:
    """One val target: per arm, the seeds that reached it within τ (of those with a curve); per contrast
    ("aggregate vs serial"), RMST(reference) / RMST(arm) over the seeds both ran."""

    target: float
    registered: bool
    reached: dict[str, tuple[int, int]]
    speedups: dict[str, Estimate | None]


def at_targets(results: list[ArmResult], targets: list[float], tau: float, registered: float | None = None,
                reps: int = 2000, seed: int = 0) -> list[SensitivityRow]:
    """One row per target, in the order given (the registered target is added when it is missing)."""
    by_arm = {arm: {s: r for s, r in runs.items() if r.curve} for arm, runs in by_arm_and_seed(results).items()}
    by_arm = {arm: runs for arm, runs in by_arm.items() if runs}
    pairs = contrasts(set(by_arm))
    if registered is not None and not any(abs(t - registered) < 1e-9 for t in targets):
        targets = [*targets, registered]
    rows = []
    for target in targets:
        obs: dict[str, dict[int, TimeToTarget]] = {
            arm: {s: time_to_target(points(r), target, tau) for s, r in runs.items()} for arm, runs in by_arm.items()}
        rows.append(SensitivityRow(
            target, registered is not None and abs(target - registered) < 1e-9,
            {arm: (sum(o.reached for o in seen.values()), len(seen)) for arm, seen in obs.items()},
            {f"{arm} vs {ref}": speedup_estimate(obs[ref], obs[arm], tau, reps, seed) for arm, ref in pairs}))
    return rows


def sensitivity_table(rows: list[SensitivityRow], tau: float) -> Table:
    arms = list(dict.fromkeys(arm for r in rows for arm in r.reached))
    names = list(dict.fromkeys(name for r in rows for name in r.speedups))
    table = Table(title=f"Target sensitivity (post hoc: the registered target decides): speed-up to each val target, "
                        f"RMST ratio censored at τ = {tau:.0f} charged s, mean [95% bootstrap interval] over seeds")
    table.add_column("val target")
    for arm in arms:
        table.add_column(f"{arm} reached", justify="right")
    for name in names:
        table.add_column(name, justify="right")
    for r in rows:
        cells = [f"{r.target:g}" + (" (registered)" if r.registered else "")]
        cells += [f"{r.reached[a][0]}/{r.reached[a][1]}" if a in r.reached else "–" for a in arms]
        cells += ["–" if (e := r.speedups.get(n)) is None else e.text(2) for n in names]
        table.add_row(*cells)
    return table


def sensitivity_dict(rows: list[SensitivityRow]) -> list[dict[str, object]]:
    return [asdict(r) for r in rows]


def parse_targets(text: str) -> list[float]:
    """'0.4,0.45, 0.5' -> [0.4, 0.45, 0.5]; ValueError naming the bad entry (each a val accuracy in [0, 1])."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise ValueError("--sensitivity: no target given; e.g. --sensitivity 0.4,0.45,0.5")
    targets = []
    for part in parts:
        try:
            value = float(part)
        except ValueError:
            raise ValueError(f"--sensitivity: {part!r} is not a number; give val accuracies: 0.4,0.45") from None
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"--sensitivity: {value:g} is not a val accuracy in [0, 1]")
        targets.append(value)
    return targets
