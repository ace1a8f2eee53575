"""Acceptance rules: decide from two evaluations (per-task scores over trials) whether to keep a candidate.

Every rule is an `AcceptanceRule`: `start(...)` opens a `Validation` of one candidate against the current
harness's scores on the split's tasks; the engine runs the candidate in batches and asks `interim(partial)`
between batches (a decision stops the evaluation early), then `conclude(candidate)`. Rules, by name
(`train.acceptance`):

- sequential: an exact paired test with a stated false-accept rate `train.alpha`, looking after every batch
  and stopping early to accept or to reject (sequential.py); changes whose effect is exact on stored replies
  are decided on that exact evidence instead (exact.py);
- strict: the score strictly improves (the paper's rule);
- tolerance: keep unless the score drops by more than `tolerance`;
- noise-aware: keep only if the gain clears twice the standard error of the paired per-task difference, and no
  task that passed in every trial now fails in every trial.

strict and tolerance stop early only when the rejection is certain (no remaining score could change it);
noise-aware never stops early. The decision is taken on the same task ids on both sides and only over complete
evaluations (for sequential: or at a look that decides); otherwise it is not taken (a rejection saying why).
The `Decision` record and the paired measurements every rule shares are in decision.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from math import sqrt
from typing import TYPE_CHECKING, Protocol

from .decision import Decision, Scores, evidence, mean_of, missing_reason, paired
from .sequential import SequentialRule

if TYPE_CHECKING:
    from ..config import TrainSection

RULE_NAMES = ("sequential", "strict", "tolerance", "noise-aware")


class Validation(Protocol):
    """One candidate against the current harness on one split."""

    def interim(self, partial: Scores) -> Decision | None:
        """Between batches: a decision taken now (the evaluation stops), or None to run the next batch."""

    def conclude(self, candidate: Scores) -> Decision:
        """After the evaluation ended (complete, stopped by `interim`, or cut short): the decision."""


class AcceptanceRule(Protocol):
    name: str
    pools_exact_evidence: bool  # H2 changes with exact replays are decided on them (exact.py), not on a test

    def start(self, current: Scores, expected: list[str], split: str = "train", batch: int | None = None,
              trials: int = 1) -> Validation:
        """A validation over `expected` (the split's task ids, in batch order) against `current`'s complete
        scores; `batch`: tasks per look (None: one look at the end)."""


def _mean(per_task: Scores) -> float:
    values = [mean_of(v) for v in per_task.values() if v]
    return sum(values) / len(values) if values else 0.0


# the classic rules -----------------------------------------------------------------------------------------------
def decide(rule: str, current: Scores, candidate: Scores, tolerance: float = 0.05, split: str = "train") -> Decision:
    """Decide on per-task scores of the split edits are accepted on (`split` names it in the reason)."""
    cur, cand = _mean(current), _mean(candidate)
    if rule == "strict":
        ok = cand > cur
        verdict = "improves" if ok else "no strict gain"
        return Decision(ok, rule, cur, cand, f"{split} {cur:.3f} -> {cand:.3f}: {verdict}")
    if rule == "tolerance":
        ok = cand >= cur - tolerance
        return Decision(ok, rule, cur, cand,
                        f"{split} {cur:.3f} -> {cand:.3f}: {'within' if ok else 'beyond'} tolerance {tolerance}")
    if rule == "noise-aware":
        tasks = sorted(set(current) & set(candidate))
        diffs = list(paired(current, candidate, tasks).values())
        n = len(diffs)
        mean = sum(diffs) / n if n else 0.0
        noise = 2 * sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1) / n) if n > 1 else 1.0
        broken = [t for t in tasks if all(s >= 1.0 for s in current[t]) and all(s < 1.0 for s in candidate[t])]
        ok = mean > noise and not broken
        why = f"paired gain {mean:+.3f} vs noise {noise:.3f}"
        if broken:
            why += f"; {len(broken)} reliably passing task(s) now fail reliably"
        return Decision(ok, rule, cur, cand, why)
    if rule == "sequential":
        return SequentialRule().start(current, sorted(candidate), split).conclude(candidate)
    raise ValueError(f"unknown acceptance rule {rule!r}; use one of {', '.join(RULE_NAMES)}")


def decide_on_same_tasks(rule: str, current: Scores, candidate: Scores, expected: list[str], tolerance: float = 0.05,
                         split: str = "train", trials: int = 1) -> Decision:
    """Decide over exactly `expected` on both sides; any task missing on either side means no decision."""
    if (why := missing_reason(current, candidate, expected, split, trials)) is not None:
        return Decision(False, rule, _mean(current), _mean(candidate), f"not decided: {why}", taken=False)
    same = set(expected)
    d = decide(rule, {t: v for t, v in current.items() if t in same},
               {t: v for t, v in candidate.items() if t in same}, tolerance, split)
    return replace(d, tasks=len(same))


def rejection_certain(rule: str, current: Scores, partial: Scores, expected: list[str], tolerance: float = 0.05,
                      split: str = "train") -> Decision | None:
    """A rejection when even a perfect score on the candidate's remaining tasks could not get it accepted;
    None when the outcome is still open (or the rule is not monotone: noise-aware)."""
    if rule not in ("strict", "tolerance") or any(t not in current for t in expected):
        return None
    best = {t: partial.get(t) or [1.0] for t in expected}
    base = {t: current[t] for t in expected}
    if decide(rule, base, best, tolerance, split).accepted:
        return None
    ran = [t for t in expected if t in partial]
    cur = _mean(base)
    return Decision(False, rule, cur, _mean({t: partial[t] for t in ran}),
                    f"{split} {cur:.3f} -> at most {_mean(best):.3f} after {len(ran)}/{len(expected)} task(s): "
                    "rejected early (the remaining tasks cannot change it)", tasks=len(ran), early=True)


@dataclass(frozen=True)
class ClassicRule:
    """strict, tolerance or noise-aware as an `AcceptanceRule` (no stated error rate; no exact-evidence path)."""

    name: str
    tolerance: float = 0.05
    pools_exact_evidence: bool = False

    def start(self, current: Scores, expected: list[str], split: str = "train", batch: int | None = None,
              trials: int = 1) -> ClassicValidation:
        return ClassicValidation(self, current, list(expected), split, trials)


@dataclass
class ClassicValidation:
    rule: ClassicRule
    current: Scores
    expected: list[str]
    split: str
    trials: int
    stopped_by: Decision | None = field(default=None)

    def _with_evidence(self, d: Decision, candidate: Scores, stopped: str) -> Decision:
        tasks = [t for t in self.expected if t in candidate]
        return replace(d, evidence=evidence("rule", self.rule.name, self.split, self.current, candidate, tasks,
                                            len(self.expected), self.trials, stopped))

    def interim(self, partial: Scores) -> Decision | None:
        d = rejection_certain(self.rule.name, self.current, partial, self.expected, self.rule.tolerance, self.split)
        if d is not None and self.stopped_by is None:
            self.stopped_by = self._with_evidence(d, partial, "rejected early: the remaining tasks cannot change it")
        return self.stopped_by if d is not None else None

    def conclude(self, candidate: Scores) -> Decision:
        if self.stopped_by is not None:
            return self.stopped_by
        d = decide_on_same_tasks(self.rule.name, self.current, candidate, self.expected, self.rule.tolerance,
                                 self.split, self.trials)
        stopped = "all tasks compared" if d.taken else "not decided: an evaluation is incomplete"
        return self._with_evidence(d, candidate, stopped)


def make_rule(train: TrainSection) -> AcceptanceRule:
    """The configured rule (`train.acceptance`) with its settings."""
    if train.acceptance == "sequential":
        return SequentialRule(train.alpha, train.min_effect, train.futility)
    if train.acceptance in RULE_NAMES:
        return ClassicRule(train.acceptance, train.tolerance)
    raise ValueError(f"unknown acceptance rule {train.acceptance!r}; use one of {', '.join(RULE_NAMES)}")


def validate_in_batches(rule: AcceptanceRule, current: Scores, candidate: Scores, expected: list[str],
                        batch: int | None, split: str = "val", trials: int = 1) -> tuple[Decision, int]:
    """The engine's validation without an engine (benchmarks, tests): the candidate's scores are revealed batch by
    batch in `expected` order, `interim` is asked before every batch after the first (as `Evaluator.measure`
    asks its stop predicate), then `conclude`. Returns the decision and the candidate episodes it used."""
    validation = rule.start(current, expected, split, batch, trials)
    size = batch or len(expected) or 1
    partial: Scores = {}
    for start in range(0, len(expected), size):
        if partial and validation.interim(partial) is not None:
            break
        partial.update({t: candidate[t] for t in expected[start:start + size] if t in candidate})
    return validation.conclude(partial), sum(len(v) for v in partial.values())
