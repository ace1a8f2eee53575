"""What a training arm reports: one `TrainResult` for every arm that trains (the engine's methods and gepa,
whose `GepaResult` adds only GEPA's own fields), its costs read from the store the same way for all."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ..store.db import RunStore
from .budget import Budget, optimizer_spend, training_evaluations, training_spend
from .charged import charged_by_outcome, charged_parts
from .holdout import HoldoutCheck
from .records import AcceptRule, CurvePoint, RoundRecord


@dataclass
class TrainResult:
    """What every training arm reports (the engine's arms and gepa, whose `GepaResult` adds only GEPA's own)."""

    run_id: str
    arm: str
    seed_harness_id: str
    final_harness_id: str
    frozen_dir: Path
    stop_reason: str
    val_before: float | None  # None when the environment has no val tasks
    val_after: float | None
    test_before: dict[str, Any] | None
    test_after: dict[str, Any] | None
    wall_s: float  # real training wall time (the timed steps; gepa: its loop), not val/test reporting
    agent_executions: int  # training episodes actually run (cache-served ones are `cached_executions`)
    cached_executions: int
    optimizer_calls: int
    optimizer_tokens: int
    agent_tokens: int  # every agent token of the run, test passes included
    training_agent_tokens: int  # fresh agent tokens of the training evaluations (what best-of-k is matched to)
    budget: Budget
    curve: list[CurvePoint] = field(default_factory=list)  # point 0: the seed; then one per decision
    rounds: list[RoundRecord] = field(default_factory=list)  # the engine's rounds (gepa: none)
    accept_rule: AcceptRule | None = None  # the engine's acceptance split and rule (gepa: its own Pareto front)
    holdout: HoldoutCheck | None = None  # the final-selection check on fresh val tasks (None: not run)
    train_before: float | None = None
    train_after: float | None = None  # None: the final harness has no complete train evaluation (never a made-up 0)
    timings: dict[str, float] = field(default_factory=dict)
    prompt_cache: dict[str, tuple[int, int]] = field(default_factory=dict)  # role -> (prompt tokens, prefix-cached)
    charged_parts: dict[str, float] = field(default_factory=dict)  # where the charged seconds went (charged.py)
    cold_tokens: int = 0  # training tokens (agent + roles) a cold run would spend: each paid request once
    step_outcomes: dict[str, tuple[float, int]] = field(default_factory=dict)  # outcome -> (charged s, steps)
    charged_s: float = 0.0  # charged training seconds (trainer/charged.py): the primary training time

    def decisions(self) -> tuple[int, int]:
        """(accepted, rejected) decisions, read off the curve (step 0 is the seed, not a decision; a step cut
        before its decision, e.g. by the budget, is neither); a run recorded before curves existed: off its rounds."""
        steps = [p for p in self.curve if p.step > 0 and p.taken]
        if self.curve:
            return sum(p.accepted for p in steps), sum(not p.accepted for p in steps)
        edits = [e for r in self.rounds for e in r.attempts() if e.decision_taken]
        return sum(e.accepted for e in edits), sum(not e.accepted for e in edits)

    def to_dict(self) -> dict[str, Any]:
        out = {k: (str(v) if isinstance(v, Path) else v) for k, v in self.__dict__.items()}
        return out | {"rounds": [r.model_dump(mode="json") for r in self.rounds], "budget": asdict(self.budget),
                      "accept_rule": self.accept_rule.model_dump(mode="json") if self.accept_rule else None,
                      "holdout": self.holdout.model_dump(mode="json") if self.holdout else None,
                      "curve": [p.model_dump(mode="json") for p in self.curve]}


@dataclass(frozen=True)
class RunCosts:
    """The cost fields every arm's result reads from the store the same way."""

    optimizer_calls: int
    optimizer_tokens: int
    agent_tokens: int
    training_agent_tokens: int
    timings: dict[str, float]
    prompt_cache: dict[str, tuple[int, int]]
    charged_parts: dict[str, float]
    cold_tokens: int
    step_outcomes: dict[str, tuple[float, int]]

    @classmethod
    def of_run(cls, store: RunStore, run_id: str) -> RunCosts:
        """A run's costs; its training agent tokens over the evaluations it registered as training spend (an
        engine run: a compare seed's shared seed evaluation included), else over its non-test evaluations."""
        calls = {row["role"]: row for row in store.call_totals(run_id)}
        agent, optimizer = calls.get("agent", {}), optimizer_spend(store, run_id)
        registered = [key for key, _ in store.records(run_id, "spend")] or None
        training = registered or training_evaluations(store, run_id)
        paid = store.paid_calls_by_role(run_id, training)
        return cls(optimizer.calls, optimizer.tokens,
                   (agent.get("prompt_tokens") or 0) + (agent.get("completion_tokens") or 0),
                   training_spend(store, run_id, registered).tokens, dict(store.records(run_id, "timing")),
                   {role: (row["prompt_tokens"] or 0, row["cached_tokens"] or 0) for role, row in calls.items()},
                   charged_parts(store, run_id, training, paid), sum(t for _, t in paid.values()),
                   charged_by_outcome(store, run_id))

    def as_kwargs(self) -> dict[str, Any]:
        """As `TrainResult` keyword arguments."""
        return {f.name: getattr(self, f.name) for f in fields(self)}
