"""The training budget every arm gets (`[train.budget]`), and what a run has spent of it.

`agent_executions` counts episodes actually run for training (collect, variant picking, validation);
an episode whose every model call was served by the response cache is a *cached* execution, counted
apart and not charged. `optimizer_tokens` are the optimizer roles' fresh tokens. `wall_s` is the
training wall time (the sum of the timed steps). An arm stops at the first limit reached; evaluations
are cut to the episodes the budget has left, so every arm stops at the same agent spend.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..agent.events import ModelEvent
from ..agent.trajectory import INFRA_ERROR, Trajectory
from ..store.db import RunStore

AGENT_ROLES = ("agent", "user")  # the simulated user is part of the environment, not the optimizer


@dataclass
class Spend:
    """Cumulative training cost of one run."""

    agent_executions: int = 0
    cached_executions: int = 0
    optimizer_calls: int = 0
    optimizer_tokens: int = 0
    wall_s: float = 0.0


@dataclass(frozen=True)
class Budget:
    """Limits (None: unlimited) shared by every arm of a comparison."""

    agent_executions: int | None = None
    optimizer_tokens: int | None = None
    wall_s: float | None = None

    def exhausted(self, spend: Spend) -> str | None:
        """The stop reason when a limit is reached, else None."""
        if self.agent_executions is not None and spend.agent_executions >= self.agent_executions:
            return f"budget spent: agent_executions {spend.agent_executions}/{self.agent_executions}"
        if self.optimizer_tokens is not None and spend.optimizer_tokens >= self.optimizer_tokens:
            return f"budget spent: optimizer_tokens {spend.optimizer_tokens}/{self.optimizer_tokens}"
        if self.wall_s is not None and spend.wall_s >= self.wall_s:
            return f"budget spent: wall_s {spend.wall_s:.0f}/{self.wall_s:.0f}"
        return None

    def executions_left(self, spend: Spend) -> int | None:
        if self.agent_executions is None:
            return None
        return max(0, self.agent_executions - spend.agent_executions)


@dataclass(frozen=True)
class EpisodeSpend:
    """Agent episodes of a run's training evaluations (test passes excluded)."""

    run: int  # episodes actually run
    served: int  # episodes served entirely from the response cache
    tokens: int  # fresh agent tokens (prompt + completion as the model reported them; cache hits excluded)


@dataclass(frozen=True)
class RoleSpend:
    """Calls and fresh tokens of a run's optimizer roles (every role but `AGENT_ROLES`)."""

    calls: int
    tokens: int


def cached(traj: Trajectory) -> bool:
    """An episode served entirely from the response cache (it made model calls, all of them hits)."""
    return traj.model_calls > 0 and traj.cache_hits >= traj.model_calls


def agent_tokens(traj: Trajectory, fresh_only: bool = False) -> int:
    """Agent tokens (prompt + completion) of an episode's model calls as the model reported them; a response-cache
    hit reports the original call's usage (what running the episode fresh costs) unless `fresh_only`."""
    return sum(int(e.usage.get("prompt_tokens", 0)) + int(e.usage.get("completion_tokens", 0))
               for e in traj.of(ModelEvent) if not (fresh_only and e.cache_hit))


def training_spend(store: RunStore, run_id: str) -> EpisodeSpend:
    """What a run's non-test evaluations cost in agent episodes and tokens (infra-lost episodes excluded)."""
    fresh = served = tokens = 0
    for ev in store.evaluations(run_id):
        if ev["split"] == "test" or (ev["label"] or "").startswith("test"):
            continue
        for t in store.trajectories(ev["id"]):
            if t.termination == INFRA_ERROR:
                continue
            served += cached(t)
            fresh += not cached(t)
            tokens += agent_tokens(t, fresh_only=True)
    return EpisodeSpend(fresh, served, tokens)


def optimizer_spend(store: RunStore, run_id: str) -> RoleSpend:
    """The run's optimizer roles: calls and fresh tokens."""
    rows = [r for r in store.call_totals(run_id) if r["role"] not in AGENT_ROLES]
    return RoleSpend(sum(r["calls"] for r in rows),
                     sum((r["prompt_tokens"] or 0) + (r["completion_tokens"] or 0) for r in rows))
