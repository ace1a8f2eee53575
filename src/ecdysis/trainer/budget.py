"""The training budget every arm gets (`[train.budget]`), and what a run has spent of it.

`agent_executions` counts episodes actually run for training (collect, variant picking, validation);
an episode whose every model call was served by the response cache is a *cached* execution, counted
apart and not charged. `optimizer_tokens` are the optimizer roles' fresh tokens. `wall_s` is the
training wall time (the sum of the timed steps). An arm stops at the first limit reached; evaluations
are cut to the episodes the budget has left, so every arm stops at the same agent spend.
"""

from __future__ import annotations

from dataclasses import dataclass

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
