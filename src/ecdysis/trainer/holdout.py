"""The final-selection check: before freezing, the trained harness and the seed on val tasks no acceptance
decision saw (the val pool beyond `train.val_limit`).

Every accepted edit was decided on the same val tasks; a harness chosen by several decisions on them can look
better there than it is (selection on noise). The check re-measures the trained harness against the seed on fresh
tasks and freezes it unless those tasks show it *worse* than the seed — the exact one-sided sign test on the
paired per-task outcomes at `train.alpha` — in which case the seed is frozen and the record says why. It guards
against an accumulated loss; it is not a second acceptance test (a fresh slice of a few tasks cannot confirm a
small gain, and asking it to would throw most real gains away). Its result is recorded with the run and shown by
`train`, `show` and the report; the optimizer roles never see it (it runs after training).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from ..config import TrainSection
from ..envs.base import Task
from ..harness.manifest import HarnessVersion
from ..runner.runner import Runner
from .sequential import exact_sign_test

MIN_AUTO_TASKS = 8  # "auto" checks only when the pool beyond val_limit holds at least this many val tasks


class HoldoutCheck(BaseModel):
    """The trained harness against the seed on the held-out slice, and which of them was frozen."""

    tasks: int
    trials: int
    seed_score: float
    final_score: float
    wins: int  # tasks where the trained harness scored higher than the seed
    losses: int  # ... lower
    p_worse: float  # one-sided exact sign test: the chance of this many losses (or more) with no real loss
    p_better: float  # ... of this many wins with no real gain
    alpha: float
    kept: Literal["final", "seed"]
    why: str

    def line(self) -> str:
        """One line for the CLI and the report."""
        effect = self.final_score - self.seed_score
        return (f"final-selection check on {self.tasks} held-out val task(s): seed {self.seed_score:.3f} -> trained "
                f"{self.final_score:.3f} ({effect:+.3f}; {self.wins} won, {self.losses} lost; p(worse) "
                f"{self.p_worse:.3f}, p(better) {self.p_better:.3f}): {self.why}")


def holdout_size(train: TrainSection, extra: int) -> int:
    """How many of the `extra` val tasks beyond the acceptance split to check on: `train.holdout_limit` when a
    number (at most what there is), or under "auto" as many as the acceptance split has, when at least
    `MIN_AUTO_TASKS` are there (fewer could only detect a collapse)."""
    limit = train.holdout_limit
    if limit == "auto":
        size = min(extra, train.val_limit if isinstance(train.val_limit, int) else extra)
        return size if size >= MIN_AUTO_TASKS else 0
    return min(int(limit), extra)


def holdout_tasks(val_pool: list[Task], acceptance: list[Task], train: TrainSection) -> list[Task]:
    """The val tasks of the seeded pool that the acceptance split does not hold, as many as `holdout_size`
    allows (none when edits are decided on train: then val was never looked at, and `val_scores` reports it)."""
    if not acceptance:
        return []
    used = {t.id for t in acceptance}
    extra = [t for t in val_pool if t.id not in used]
    return extra[:holdout_size(train, len(extra))]


def compare(seed: dict[str, list[float]], final: dict[str, list[float]], tasks: list[Task], trials: int,
            alpha: float) -> HoldoutCheck:
    """The paired per-task comparison and the verdict (tasks scored on both sides only)."""
    ids = [t.id for t in tasks if seed.get(t.id) and final.get(t.id)]

    def mean(xs: list[float]) -> float:
        return sum(xs) / len(xs)

    diffs = [mean(final[i]) - mean(seed[i]) for i in ids]
    wins, losses = sum(d > 0 for d in diffs), sum(d < 0 for d in diffs)
    p_worse, p_better = exact_sign_test(losses, wins), exact_sign_test(wins, losses)
    seed_score = mean([mean(seed[i]) for i in ids]) if ids else 0.0
    final_score = mean([mean(final[i]) for i in ids]) if ids else 0.0
    if p_worse < alpha:
        kept, why = "seed", (f"the trained harness is worse than the seed on fresh tasks (p {p_worse:.3f} < alpha "
                             f"{alpha:g}): the seed is frozen")
    else:
        kept, why = "final", ("no loss shown on fresh tasks: the trained harness is frozen" if losses <= wins else
                              f"fewer losses than would show a real loss at alpha {alpha:g}: the trained harness "
                              "is frozen")
    return HoldoutCheck(tasks=len(ids), trials=trials, seed_score=seed_score, final_score=final_score, wins=wins,
                        losses=losses, p_worse=p_worse, p_better=p_better, alpha=alpha, kept=kept, why=why)


async def check(runner: Runner, seed: HarnessVersion, final: HarnessVersion, tasks: list[Task], trials: int,
                alpha: float) -> HoldoutCheck | None:
    """Evaluate the seed and the trained harness on `tasks` (label `holdout`; resumed like every evaluation);
    None when there is nothing to check (no tasks, or training kept the seed)."""
    if not tasks or final.id == seed.id:
        return None
    before = await runner.evaluate(seed, tasks, trials, "val", "holdout")
    after = await runner.evaluate(final, tasks, trials, "val", "holdout")
    return compare(before.per_task, after.per_task, tasks, trials, alpha)
