"""What each arm's charged time bought: its training steps by what they came to (accepted, validated and
rejected, nothing new built, cut short), mean charged seconds and steps per seed. Beside the registered metrics,
it says where a miss's time went: e.g. rounds whose spec changed nothing, paid for and never validated. A row
without step outcomes (gepa's, or one recorded before they were) is left out of its arm's mean, and the table
says how many seeds each mean is over. `other`: a curve point without a decision record (gepa's iterations)."""

from __future__ import annotations

from rich.table import Table

from ..trainer.records import STEP_OUTCOMES
from .factorial import by_arm_and_seed
from .results import ArmResult


def mean_outcomes(runs: list[ArmResult]) -> dict[str, tuple[float, float]]:
    """Outcome -> (mean charged s, mean steps) per seed, over the seeds that recorded their steps' outcomes
    (an outcome a seed lacks counts 0 there); empty when none did."""
    found = [r.step_outcomes for r in runs if r.step_outcomes]
    names = [n for n in (*STEP_OUTCOMES, "other") if any(n in f for f in found)]
    return {n: (sum(f[n][0] for f in found if n in f) / len(found), sum(f[n][1] for f in found if n in f) / len(found))
            for n in names}


def outcome_table(results: list[ArmResult]) -> Table | None:
    """One row per arm that recorded its steps' outcomes (None: no arm did)."""
    by_arm = {arm: list(runs.values()) for arm, runs in by_arm_and_seed(results).items()}
    means = {arm: m for arm, runs in by_arm.items() if (m := mean_outcomes(runs))}
    if not means:
        return None
    names = [n for n in (*STEP_OUTCOMES, "other") if any(n in m for m in means.values())]
    table = Table(title="What the charged time bought: mean charged s per seed on training steps, by what each "
                        "step came to (steps in brackets; the seed evaluation apart; seeds: those that recorded "
                        "their steps' outcomes)")
    for name in ("arm", "seeds", *names):
        table.add_column(name, justify="left" if name == "arm" else "right")
    for arm, m in means.items():
        recorded = sum(1 for r in by_arm[arm] if r.step_outcomes)
        table.add_row(arm, f"{recorded} of {len(by_arm[arm])}",
                      *(f"{m[n][0]:.0f} ({m[n][1]:.1f})" if n in m else "–" for n in names))
    return table
