"""Failures as data: what went wrong in an evaluation besides wrong answers, counted by kind.

A wrong answer is the harness's (or the model's) result. These are not results, and an evaluation summary
counts them apart, each kind with its first message, so a user sees them and training does not "fix" them:

    grader_error   the grader raised or returned something that is not a score: the episode's 0 says nothing
    harness_crash  harness code raised, the worker died or hit a resource limit (the traceback is kept)
    budget_stop    the episode's turn or rejection budget ran out, or the run's agent-token budget left
                   episodes unrun
    timeout        the task's wall-clock limit
    model_error    the model backend failed for good
    infra_loss     the executor lost the episode (not scored; run again on the next invocation)

`count_failures` is the one function that classifies episodes; `runner.summarize` calls it for every
evaluation summary, and the views read its result.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ..agent.trajectory import INFRA_ERROR, Trajectory

GRADER_ERROR_KEY = "grader_error"  # in `Score.components` / `Trajectory.score_components`: the grader's failure
TRACEBACK_LINES = 8  # the tail of a traceback shown under a summary
# a frame in the episode's harness directory (not the library's own ecdysis/harness package)
_HARNESS_FRAME = re.compile(r'File "(?![^"]*/ecdysis/harness/)[^"]*/harness/([^"/]+)", line (\d+)')
EXIT_GRADER_FAILED = 3  # `eval`, `train`, `compare` exit status when the grader failed on some episode


class FailureKind(StrEnum):
    GRADER_ERROR = "grader_error"
    HARNESS_CRASH = "harness_crash"
    BUDGET_STOP = "budget_stop"
    TIMEOUT = "timeout"
    MODEL_ERROR = "model_error"
    INFRA_LOSS = "infra_loss"

    @property
    def label(self) -> str:
        return _LABELS[self]


_LABELS = {FailureKind.GRADER_ERROR: "grader errors", FailureKind.HARNESS_CRASH: "harness crashes",
           FailureKind.BUDGET_STOP: "budget stops", FailureKind.TIMEOUT: "timeouts",
           FailureKind.MODEL_ERROR: "model errors", FailureKind.INFRA_LOSS: "infrastructure losses"}
_BY_TERMINATION = {"crash": FailureKind.HARNESS_CRASH, "timeout": FailureKind.TIMEOUT,
                   "model_error": FailureKind.MODEL_ERROR, INFRA_ERROR: FailureKind.INFRA_LOSS,
                   "max_turns": FailureKind.BUDGET_STOP, "rejected": FailureKind.BUDGET_STOP,
                   "budget": FailureKind.BUDGET_STOP}


@dataclass(frozen=True)
class Failure:
    """One failure of one episode: its kind, a one-line message and (crashes) the traceback's tail."""

    kind: FailureKind
    task_id: str
    trial: int
    message: str
    traceback: str = ""


def traceback_tail(text: str | None, lines: int = TRACEBACK_LINES) -> str:
    """The last `lines` non-empty lines of a traceback (where the exception is), widened to start at a frame's
    `File ...` line when one is a few lines before."""
    kept = [line for line in (text or "").rstrip().splitlines() if line.strip()]
    start = max(0, len(kept) - lines)
    frame = next((i for i in range(start, max(-1, start - 4), -1) if kept[i].lstrip().startswith("File ")), None)
    return "\n".join(kept[start if frame is None else frame:])


def _crash_message(text: str | None) -> str:
    """The exception line of a crash, with the harness file and line it was raised in when the traceback says."""
    tail = [line for line in (text or "").strip().splitlines() if line.strip()]
    if not tail:
        return "(no message recorded)"
    frames = _HARNESS_FRAME.findall(text or "")
    where = f" ({frames[-1][0]}, line {frames[-1][1]})" if frames else ""
    return f"{tail[-1].strip()[:300]}{where}"


def grader_error_of(traj: Trajectory) -> str | None:
    """The grader's failure on this episode, or None when it graded it (rightly or wrongly)."""
    error = traj.score_components.get(GRADER_ERROR_KEY) if isinstance(traj.score_components, dict) else None
    return (traj.score_detail or str(error)) if error else None


def failures_of(traj: Trajectory) -> list[Failure]:
    """Every failure of one episode (an episode may both crash and break the grader)."""
    out: list[Failure] = []
    kind = _BY_TERMINATION.get(traj.termination)
    if kind is FailureKind.HARNESS_CRASH:
        out.append(Failure(kind, traj.task_id, traj.trial, _crash_message(traj.traceback),
                           traceback_tail(traj.traceback)))
    elif kind in (FailureKind.TIMEOUT, FailureKind.MODEL_ERROR, FailureKind.INFRA_LOSS):
        first = (traj.traceback or "").strip().splitlines()[0][:300] if traj.traceback else "(no message recorded)"
        out.append(Failure(kind, traj.task_id, traj.trial, first))
    elif kind is FailureKind.BUDGET_STOP:
        out.append(Failure(kind, traj.task_id, traj.trial, _budget_message(traj)))
    if traj.termination != INFRA_ERROR and (error := grader_error_of(traj)):
        out.append(Failure(FailureKind.GRADER_ERROR, traj.task_id, traj.trial, error[:500]))
    return out


def _budget_message(traj: Trajectory) -> str:
    if traj.termination == "rejected":
        rejections = traj.of_kind("rejection")
        last = rejections[-1] if rejections else {}
        return (f"H2 rejected {len(rejections)} replies (budget.max_rejections ran out); last: rule "
                f"{last.get('rule', '?')}: {str(last.get('feedback', ''))[:200]}")
    if traj.termination == "budget":  # the host refused a call over the episode's or the run's budget
        return (traj.traceback or "the host refused a model call over the budget").strip().splitlines()[0][:300]
    return f"the turn budget ran out (budget.max_turns) after {traj.model_calls} model call(s)"


@dataclass
class FailureCount:
    """How many episodes failed this way, and the first of them."""

    kind: FailureKind
    count: int
    first: Failure

    def to_dict(self) -> dict[str, Any]:
        return {"kind": str(self.kind), "count": self.count, "task_id": self.first.task_id,
                "trial": self.first.trial, "message": self.first.message, "traceback": self.first.traceback}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FailureCount:
        kind = FailureKind(data["kind"])
        return cls(kind, int(data["count"]), Failure(kind, str(data.get("task_id", "")), int(data.get("trial", 0)),
                                                     str(data.get("message", "")), str(data.get("traceback", ""))))


@dataclass
class FailureCounts:
    """An evaluation's failures by kind (in `FailureKind` order; kinds with none are left out)."""

    kinds: list[FailureCount] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.kinds)

    def of(self, kind: FailureKind) -> int:
        return next((c.count for c in self.kinds if c.kind is kind), 0)

    def first(self, kind: FailureKind) -> Failure | None:
        return next((c.first for c in self.kinds if c.kind is kind), None)

    @property
    def grader_errors(self) -> int:
        return self.of(FailureKind.GRADER_ERROR)

    def to_dict(self) -> list[dict[str, Any]]:
        return [c.to_dict() for c in self.kinds]

    @classmethod
    def from_dict(cls, data: list[dict[str, Any]] | None) -> FailureCounts:
        return cls([FailureCount.from_dict(d) for d in data or []])

    def text(self) -> str:
        """`grader_error=6, harness_crash=2` (empty when nothing failed)."""
        return ", ".join(f"{c.kind}={c.count}" for c in self.kinds)


def count_failures(recorded: list[Trajectory], not_run: int = 0, not_run_reason: str = "") -> FailureCounts:
    """Count the failures of an evaluation's recorded episodes (lost ones included), in episode order;
    `not_run` episodes the run's budget left unrun count as budget stops."""
    firsts: dict[FailureKind, Failure] = {}
    counts: dict[FailureKind, int] = {}
    for traj in sorted(recorded, key=lambda t: (t.trial, t.task_id)):
        for failure in failures_of(traj):
            firsts.setdefault(failure.kind, failure)
            counts[failure.kind] = counts.get(failure.kind, 0) + 1
    if not_run > 0:
        kind = FailureKind.BUDGET_STOP
        firsts.setdefault(kind, Failure(kind, "", 0, f"{not_run} episode(s) not run: {not_run_reason}"))
        counts[kind] = counts.get(kind, 0) + not_run
    return FailureCounts([FailureCount(k, counts[k], firsts[k]) for k in FailureKind if k in counts])


def merge_counts(counts: list[FailureCounts]) -> FailureCounts:
    """Several evaluations' failures as one: counts summed by kind, each kind's first from the earliest."""
    merged: dict[FailureKind, FailureCount] = {}
    for c in (c for fc in counts for c in fc.kinds):
        if c.kind in merged:
            merged[c.kind].count += c.count
        else:
            merged[c.kind] = FailureCount(c.kind, c.count, c.first)
    return FailureCounts([merged[k] for k in FailureKind if k in merged])


class GraderFailed(Exception):
    """The grader failed on some episodes of an evaluation training would decide on: their scores are not
    the harness's, so training stops before diagnosing them (the CLI exits EXIT_GRADER_FAILED)."""

    def __init__(self, split: str, episodes: int, failures: FailureCounts) -> None:
        self.split, self.episodes, self.failures = split, episodes, failures
        first = failures.first(FailureKind.GRADER_ERROR)
        where = f"task {first.task_id}: {first.message}" if first else ""
        super().__init__(
            f"the grader failed on {failures.grader_errors} of {episodes} {split} episode(s) (first, {where}). "
            "Those scores say nothing about the harness, so training stops here instead of diagnosing them. "
            "Fix the grader, then run the same command again: the model's replies are reused where stored or "
            "cached.")
