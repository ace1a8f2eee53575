"""A decision on one candidate, and the paired measurements every acceptance rule takes it from.

`Scores` are per-task scores over trials. `paired` is the per-task difference candidate - current harness on the
tasks both sides scored; `evidence` is the decision record's counts (`records.DecisionEvidence`); `missing_reason`
says why two evaluations cannot be compared. The rules themselves are in `accept.py` (the classic ones and the
rule protocol) and `sequential.py` (the sequential test).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..runner.runner import pass_hat_k
from .records import DecisionEvidence

Scores = dict[str, list[float]]


@dataclass(frozen=True)
class Decision:
    """Whether a candidate is kept, by which rule, on what mean scores, and why."""

    accepted: bool
    rule: str
    current: float
    candidate: float
    reason: str
    taken: bool = True  # False: the evaluations were incomplete or disjoint, nothing was compared
    tasks: int = 0  # task ids compared
    early: bool = False  # decided before every task of the split ran
    evidence: DecisionEvidence | None = None


def mean_of(scores: list[float]) -> float:
    return sum(scores) / len(scores)


def paired(current: Scores, candidate: Scores, tasks: list[str]) -> dict[str, float]:
    """Per task: the candidate's mean score - the current harness's (tasks scored on both sides only)."""
    return {t: mean_of(candidate[t]) - mean_of(current[t]) for t in tasks if candidate.get(t) and current.get(t)}


def noise_floor(current: Scores, tasks: list[str]) -> float | None:
    """How often two trials of the current harness disagree on a task (mean |a - b| over trial pairs, averaged
    over tasks with at least two trials); None without repeated trials."""
    values = []
    for t in tasks:
        s = current.get(t) or []
        pairs = [abs(a - b) for i, a in enumerate(s) for b in s[i + 1:]]
        if pairs:
            values.append(sum(pairs) / len(pairs))
    return sum(values) / len(values) if values else None


def pass_hat(scores: Scores, tasks: list[str], k: int) -> float:
    """pass^k: the chance that k trials of a task all pass, averaged over tasks."""
    values = [pass_hat_k(len(s), sum(x >= 1.0 for x in s), min(k, len(s))) for t in tasks if (s := scores.get(t))]
    return sum(values) / len(values) if values else 0.0


def evidence(kind: str, rule: str, split: str, current: Scores, candidate: Scores, tasks: list[str], pool: int,
             trials: int, stopped: str, **extra: object) -> DecisionEvidence:
    """The decision record's counts over `tasks`; `extra` sets the test's own fields."""
    d = paired(current, candidate, tasks)
    noisy = trials > 1
    return DecisionEvidence(
        kind=kind, rule=rule, split=split, tasks=len(d), pool=pool, trials=trials,  # type: ignore[arg-type]
        wins=sum(x > 0 for x in d.values()), losses=sum(x < 0 for x in d.values()),
        ties=sum(x == 0 for x in d.values()), effect=sum(d.values()) / len(d) if d else 0.0,
        episodes=sum(len(v) for t, v in candidate.items()), stopped=stopped,
        noise=noise_floor(current, tasks) if noisy else None,
        pass_hat_k=(pass_hat(current, tasks, trials), pass_hat(candidate, tasks, trials)) if noisy else None,
        **extra)  # type: ignore[arg-type]


def missing_reason(current: Scores, candidate: Scores, expected: list[str], split: str, trials: int) -> str | None:
    """Why the two sides cannot be compared over `expected` (tasks without all their trials), or None."""
    missing = {side: [t for t in expected if len(scores.get(t, [])) < trials]
               for side, scores in (("current", current), ("candidate", candidate))}
    if not missing["current"] and not missing["candidate"]:
        return None
    return "; ".join(f"{side} harness lacks {len(m)}/{len(expected)} {split} task(s)" for side, m in missing.items()
                     if m)
