"""Exact replay of whole episodes from their stored replies: a candidate harness runs the episode again
(sandboxed, real environment) while every model and user turn is served from the stored trajectory.

A turn is served only when the candidate asks exactly what the original asked (the same messages, at that
point of the stored episode or later in it, e.g. after a retry the candidate no longer needs; for the
simulated user the same conversation), so whatever the episode does is what it would do live: when
it ends without a question the stored trajectory cannot answer, its grade is exact. When it asks
something new (its actions diverged earlier and the model would now see a different history), the
episode stops there and the result says so: `exact=False`, the turn it diverged at. No model calls.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ..agent.events import ModelEvent, UserEvent
from ..agent.trajectory import Trajectory, digest
from ..envs.base import Task
from ..harness.manifest import HarnessVersion

DIVERGED = "replay diverged: the candidate asked what the stored episode never asked"


@dataclass(frozen=True)
class RerunOutcome:
    """One episode re-run with stored replies. `passed`/`score` are exact only when `exact`."""

    exact: bool
    passed: bool
    score: float
    diverged_at: int | None = None  # the model (or user) turn the candidate asked something new at
    final_answer: str | None = None


EpisodeRerun = Callable[[HarnessVersion, Task, Trajectory], Awaitable[RerunOutcome]]


def _canonical(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages without empty optional fields, so a stored and a live request compare equal."""
    return [{k: v for k, v in m.items() if v not in (None, [], "") or k == "content"} for m in messages]


class StoredTurns:
    """The host-side chat and user handlers of a re-run: they answer from one stored trajectory."""

    def __init__(self, traj: Trajectory) -> None:
        self.models = traj.of(ModelEvent)
        self.users = traj.of(UserEvent)
        self.model_index = 0
        self.user_index = 0
        self.diverged_at: int | None = None

    async def chat(self, messages: list[dict[str, Any]], params: dict[str, Any]) -> dict[str, Any]:
        i = self.model_index
        asked = _canonical(messages)
        if i >= len(self.models) or _canonical(self.models[i].messages) != asked:
            # the same request later in the stored episode (the candidate skipped a retry the original needed):
            # its stored reply is what the model gave to exactly this request
            later = next((j for j in range(i + 1, len(self.models))
                          if _canonical(self.models[j].messages) == asked), None)
            if later is None:
                self.diverged_at = i
                return {"error": DIVERGED}
            i = self.model_index = later
        self.model_index += 1
        e = self.models[i]
        return {"text": e.reply, "tool_calls": e.tool_calls,
                "finish_reason": e.finish_reason, "usage": {"prompt_tokens": 0, "completion_tokens": 0},
                "latency_s": 0.0, "cache_hit": True}

    async def user(self, conversation: list[dict[str, str]]) -> dict[str, Any]:
        j = self.user_index
        if j >= len(self.users) or self.users[j].seen != digest(conversation):
            self.diverged_at = self.model_index
            return {"error": DIVERGED}
        self.user_index += 1
        e = self.users[j]
        return {"text": e.text, "stop": e.stop, "reason": e.reason}


def runner_rerun(runner: Any) -> EpisodeRerun:
    """An `EpisodeRerun` on a `Runner`'s executor, environment and sandbox settings (grading in the host)."""
    from ..runner.runner import grade_safely

    async def rerun(candidate: HarnessVersion, task: Task, traj: Trajectory) -> RerunOutcome:
        turns = StoredTurns(traj)
        runner.replays += 1
        episode = runner.episode(candidate, task, traj.trial)  # the same sandbox view as a live episode
        conversational = task.user_scenario is not None
        new = await runner.executor.run(episode, turns.chat, turns.user if conversational else None)
        if turns.diverged_at is not None or new.termination in ("infra_error", "timeout"):
            return RerunOutcome(False, False, 0.0, turns.diverged_at)
        score = grade_safely(runner.env, task, new)
        return RerunOutcome(True, score.passed, score.value, None, new.final_answer)

    return rerun
