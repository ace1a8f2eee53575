"""The training budget every arm gets (`[train.budget]`), and what a run has spent of it.

`agent_executions` counts episodes actually run for training (collect, variant picking, validation);
an episode whose every model call was served by the response cache is a *cached* execution, counted
apart and not against this limit (charged seconds still count its calls). `optimizer_tokens` are the
optimizer roles' fresh tokens. `wall_s` is the training time in *charged* seconds (trainer/charged.py:
model calls at measured rates, sandbox time per episode; the same on a busy machine as on an idle one); the
real wall time of the timed steps is kept beside
it (`Spend.wall_s`). An arm stops at the first limit reached; evaluations are cut to the episodes the budget
has left, and stop starting episodes once the time is spent, so every arm stops at the same spend.
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
    wall_s: float = 0.0  # real wall time of the timed steps (reported beside the charged time)
    charged_s: float = 0.0  # charged seconds: what the `wall_s` limit is checked against


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
        if self.wall_s is not None and spend.charged_s >= self.wall_s:
            return f"budget spent: wall_s {spend.charged_s:.0f}/{self.wall_s:.0f} (charged seconds)"
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


def training_evaluations(store: RunStore, run_id: str) -> list[str]:
    """A run's own evaluations that are not test passes or the final-selection check (`holdout`, after training)."""
    return [ev["id"] for ev in store.evaluations(run_id)
            if ev["split"] != "test" and not (ev["label"] or "").startswith(("test", "holdout"))]


def training_spend(store: RunStore, run_id: str, eval_ids: list[str] | None = None) -> EpisodeSpend:
    """What a run's non-test evaluations (or `eval_ids`: an engine run's registered training evaluations, a
    shared seed evaluation included) cost in agent episodes and tokens (infra-lost episodes excluded)."""
    fresh = served = tokens = 0
    for eval_id in training_evaluations(store, run_id) if eval_ids is None else eval_ids:
        for t in store.trajectories(eval_id):
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
