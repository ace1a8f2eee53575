"""The Ecdysis training loop: collect -> aggregate -> FDCR spec -> implement + check -> validate -> accept.

Every step is recorded in the run store as it finishes; running the same config again resumes:
finished evaluations, debate turns, specs, candidates and decisions are read back, not redone.
The test split is loaded only after training, in `freeze_and_test`: no optimizer role can see it.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from ..agent.trajectory import INFRA_ERROR, Trajectory
from ..envs.base import Task
from ..harness.manifest import HarnessVersion
from ..models.base import ChatRequest, ChatResponse
from ..models.cache import MeteredModel
from ..runner.runner import EvalSummary, Runner
from ..workspace import Workspace
from . import records
from .accept import Decision, decide
from .failures import Pattern, aggregate, failure_record
from .fdcr import DEBATE_ROLES, SpecWriter
from .implement import ExternalCommand, Implementer
from .levers import attach, library_demo_spec, measure_repairs, measurement_records
from .records import AcceptRule, RoundRecord, SpecRecord
from .spec import HarnessSpec
from .view import TrainView

T = TypeVar("T")
ROLES = (*DEBATE_ROLES, "moderator", "implementer")


@dataclass
class TrainResult:
    run_id: str
    arm: str
    seed_harness_id: str
    final_harness_id: str
    frozen_dir: Path
    rounds: list[RoundRecord]
    stop_reason: str
    train_before: float
    train_after: float
    val_before: float | None  # None when the environment has no val tasks
    val_after: float | None
    accept_rule: AcceptRule
    test_before: dict[str, Any] | None
    test_after: dict[str, Any] | None
    wall_s: float
    agent_executions: int
    optimizer_calls: int
    optimizer_tokens: int
    agent_tokens: int
    timings: dict[str, float] = field(default_factory=dict)
    prompt_cache: dict[str, tuple[int, int]] = field(default_factory=dict)  # role -> (prompt tokens, prefix-cached)

    def to_dict(self) -> dict[str, Any]:
        out = {k: (str(v) if isinstance(v, Path) else v) for k, v in self.__dict__.items()}
        return out | {"rounds": [r.model_dump(mode="json") for r in self.rounds],
                      "accept_rule": self.accept_rule.model_dump(mode="json")}


def outcomes(trajectories: list[Trajectory]) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    for t in trajectories:
        trials, passes = out.get(t.task_id, (0, 0))
        out[t.task_id] = (trials + 1, passes + int(t.passed))
    return out


class Trainer:
    """One training run of one arm (`ecdysis`: debate; `aggregate`: single analyst)."""

    def __init__(self, ws: Workspace, run_id: str, arm: str = "ecdysis", view: TrainView | None = None) -> None:
        self.ws, self.cfg, self.run_id, self.arm = ws, ws.config, run_id, arm
        self.store = ws.store
        self.view = view or TrainView(enabled=False)
        self.runner: Runner = ws.runner(run_id, cache_scope=self.cfg.cache.training_scope)
        self.test_runner: Runner = ws.runner(run_id)
        self.roles: dict[str, MeteredModel] = {r: self._role_model(r) for r in ROLES}
        self.train_tasks: list[Task] = ws.tasks("train", self.cfg.train.train_limit)
        self.val_tasks, self.accept_rule = self._acceptance_split()
        records.put(self.store, run_id, "accept_on", self.accept_rule)

    def _acceptance_split(self) -> tuple[list[Task], AcceptRule]:
        """The tasks edits are accepted on, and the rule as recorded with the run."""
        t = self.cfg.train
        val = self.ws.tasks("val", t.val_limit) if t.accept_on != "train" else []
        if t.accept_on == "val" and len(val) < t.min_val_tasks:
            raise ValueError(f"train.accept_on = 'val' but the environment has {len(val)} val task(s) "
                             f"(< train.min_val_tasks = {t.min_val_tasks}); use accept_on = 'train' or add val tasks")
        if t.accept_on != "train" and len(val) >= t.min_val_tasks:
            return val, AcceptRule(accept_on="val", tasks=len(val), rule=t.acceptance,
                                   why="edits are decided on held-out val tasks that no optimizer role sees")
        why = ("configured" if t.accept_on == "train"
               else f"only {len(val)} val task(s) (< {t.min_val_tasks}): deciding on the training tasks")
        return [], AcceptRule(accept_on="train", tasks=len(self.train_tasks), rule=t.acceptance, why=why)

    def earlier_attempts(self, r: int) -> str:
        """What earlier rounds tried and how it ended, so a new round does not repeat a rejected spec."""
        lines = []
        for k in range(1, r):
            decision = records.load(self.store, self.run_id, RoundRecord, f"r{k}")
            spec = records.load(self.store, self.run_id, SpecRecord, f"r{k}")
            changes = HarnessSpec.model_validate(spec.spec).summary() if spec and spec.spec else ""
            verdict = "accepted" if decision and decision.accepted else "rejected"
            reason = (decision.reason or "") if decision else ""
            lines.append(f"round {k}: {changes or 'no valid spec'} -> {verdict} ({reason[:200]})")
        return "\n".join(lines)

    def implementer(self) -> Implementer:
        """Builds candidates from specs: the implementer role, or the configured external command."""
        return Implementer(self.roles["implementer"], self.ws.env, self.train_tasks, self.runner.limits,
                           self.cfg.train.implement_attempts, ExternalCommand.from_config(self.cfg.train))

    def single_turn(self, harness: HarnessVersion) -> bool:
        """True when the harness offers none of the environment's tools (replay can regrade answers)."""
        offered = harness.manifest.tools
        names = tuple(getattr(self.ws.env, "tool_names", ()))
        if getattr(self.ws.env, "conversational", False):
            return False
        return not set(names) & set(names if offered is None else offered)

    def _role_model(self, role: str) -> MeteredModel:
        """This run's client for a role: the workspace's backend and cache, this run's accounting."""
        shared = self.ws.model(self.cfg.role_model(role), role=role, cache_scope=self.cfg.cache.training_scope)

        def record(role_name: str, request: ChatRequest, response: ChatResponse) -> None:
            self.store.record_call(self.run_id, None, role_name, response.model_id, response.usage.prompt_tokens,
                                   response.usage.completion_tokens, response.latency_s, response.cost_usd,
                                   response.cache_hit, response.usage.cached_tokens)

        return MeteredModel(shared.model, cache=shared.cache, role=role, scope=shared.scope,
                            listeners=[*shared.listeners, record])

    async def _timed(self, key: str, step: Callable[[], Awaitable[T]]) -> T:
        start = time.perf_counter()
        result = await step()
        previous = self.store.get_record(self.run_id, "timing", key) or 0.0
        self.store.put_record(self.run_id, "timing", key, previous + time.perf_counter() - start)
        return result

    async def _evaluate(self, version: HarnessVersion, key: str, split: str = "train") -> EvalSummary:
        tasks = self.val_tasks if split == "val" else self.train_tasks
        return await self._timed(key, lambda: self.runner.evaluate(
            version, tasks, self.cfg.train.train_trials, split, split))

    async def _accept_eval(self, version: HarnessVersion, key: str) -> EvalSummary:
        """The evaluation edits are decided on: val when the run accepts on val, else train."""
        if self.val_tasks:
            return await self._evaluate(version, key.replace("validate", "val"), "val")
        return await self._evaluate(version, key)

    def _patterns(self, summary: EvalSummary) -> tuple[list[Trajectory], list[Pattern]]:
        trajectories = [t for t in self.store.trajectories(summary.eval_id) if t.termination != INFRA_ERROR]
        gold = {t.id: t.gold for t in self.train_tasks}
        threshold = self.cfg.train.failure_threshold
        failures = [failure_record(t, gold[t.task_id]) for t in trajectories if t.score < threshold]
        return trajectories, aggregate(failures, outcomes(trajectories), self.cfg.train.max_evidence_per_pattern)

    async def _grounded_patterns(self, key: str, current: HarnessVersion,
                                 summary: EvalSummary) -> tuple[list[Trajectory], list[Pattern]]:
        """Aggregate, then measure every built-in repair on the stored replies and rank the patterns
        (stored per round, so a resumed run reads them back)."""
        trajectories, patterns = self._patterns(summary)
        stored = self.store.get_record(self.run_id, "patterns", key)
        if stored is not None:
            return trajectories, [Pattern(**d) for d in stored]
        tasks = {t.id: t for t in self.train_tasks}
        measurements = await self._timed(f"{key}/measure", lambda: measure_repairs(
            current, trajectories, self.ws.env, tasks, self.runner.limits, self.single_turn(current)))
        self.store.put_record(self.run_id, "measurements", key, measurement_records(measurements))
        patterns = attach(patterns, measurements, trajectories, tasks)
        self.store.put_record(self.run_id, "patterns", key, [p.to_dict() for p in patterns])
        return trajectories, patterns

    async def _round(self, r: int, current: HarnessVersion) -> RoundRecord:
        key = f"r{r}"
        summary = await self._evaluate(current, f"{key}/collect")
        trajectories, patterns = await self._grounded_patterns(key, current, summary)
        self.view.round(r, current.id, summary.accuracy, patterns)
        record = RoundRecord(round=r, harness_before=current.id, harness_after=current.id,
                             train_score=summary.accuracy, patterns=len(patterns),
                             recurring=sum(p.classification == "recurring" for p in patterns))
        if record.recurring == 0:
            return record.model_copy(update={"stop": "nothing recurring left", "reason": "no recurring pattern"})
        spec_record = records.load(self.store, self.run_id, SpecRecord, key)
        if spec_record is None:
            writer = SpecWriter(self.store, self.run_id, self.roles, self.cfg.roles)
            outcome = await self._timed(f"{key}/spec", lambda: writer.write(
                key, current, patterns, self.cfg.train.debate_passes, debate=self.arm == "ecdysis",
                earlier=self.earlier_attempts(r)))
            spec_record = SpecRecord(spec=outcome.spec.model_dump() if outcome.spec else None, error=outcome.error)
            records.put(self.store, self.run_id, key, spec_record)
        implementer = self.implementer()
        spec, candidate = None, None
        if spec_record.spec is not None:
            spec = HarnessSpec.model_validate(spec_record.spec)
            self.view.spec(spec)
            candidate = await self._timed(f"{key}/implement", lambda: implementer.build(
                current, spec, trajectories, single_turn=self.single_turn(current)))
        if (candidate is None or candidate.version is None) and (demo := library_demo_spec(patterns)) is not None:
            # every measured lever is spent and the roles gave nothing that runs: the library's own
            # model-level candidate (a demonstration bootstrapped from a passing task), decided by acceptance
            spec = demo
            record.library_candidate = "add_demo"
            candidate = await self._timed(f"{key}/implement", lambda: implementer.build(
                current, demo, trajectories, single_turn=self.single_turn(current)))
        if spec is None or candidate is None:
            return record.model_copy(update={"reason": spec_record.error})
        self.store.put_record(self.run_id, "candidate", key, {
            "harness": candidate.version.id if candidate.version else None, "applied": candidate.applied,
            "attempts": candidate.attempts, "error": candidate.error,
            "replay": candidate.replay.to_dict() if candidate.replay else None})
        if candidate.version is None:
            return record.model_copy(update={"reason": f"no candidate passed the checks: {candidate.error}"})
        self.store.save_version(candidate.version, parent=current.id, note=f"{self.arm} {key}")
        chosen, validation, decision, variant = await self._validate(
            key, current, spec, candidate.version, summary.per_task, implementer, trajectories)
        self.view.decision(decision.accepted, f"{variant}: {decision.reason}")
        return record.model_copy(update={
            "candidate": chosen.id, "candidate_score": validation.accuracy, "variant": variant,
            "decided_on": validation.split, "accepted": decision.accepted, "reason": decision.reason,
            "harness_after": chosen.id if decision.accepted else current.id})

    async def _validate(self, key: str, current: HarnessVersion, spec: HarnessSpec, candidate: HarnessVersion,
                        base: dict[str, list[float]], implementer: Implementer,
                        trajectories: list[Trajectory]) -> tuple[HarnessVersion, EvalSummary, Decision, str]:
        """Validate the candidate on the training split and decide by the acceptance rule.

        When the spec bundles H2 repairs with prompt edits and the cache is on, the repairs alone are
        validated too (their model calls are cache hits) and the better of the two is decided on, so a
        noisy prompt edit cannot drag a good repair down with it. Returns (chosen, its summary, decision,
        which variant)."""
        validation = await self._accept_eval(candidate, f"{key}/validate")
        chosen, variant = (candidate, validation), "whole spec"
        part = spec.deterministic_part()
        if part is not None and self.ws.cache is not None:
            sub = await implementer.build(current, part, trajectories, single_turn=self.single_turn(current))
            if sub.version is not None and sub.version.id != candidate.id:
                self.store.save_version(sub.version, parent=current.id, note=f"{self.arm} {key} repairs only")
                sub_validation = await self._accept_eval(sub.version, f"{key}/validate-repairs")
                if sub_validation.accuracy >= validation.accuracy:
                    chosen, variant = (sub.version, sub_validation), "repairs only"
        if self.val_tasks:  # the current harness on val (an evaluation already stored after the first round)
            base = (await self._evaluate(current, f"{key}/val-base", "val")).per_task
        decision = decide(self.cfg.train.acceptance, base, chosen[1].per_task, self.cfg.train.tolerance,
                          split=chosen[1].split or "train")
        return chosen[0], chosen[1], decision, variant

    async def train(self, seed: HarnessVersion) -> tuple[HarnessVersion, list[RoundRecord], str]:
        """Run up to R rounds; returns (final harness, round records, stop reason)."""
        self.store.save_version(seed, note="seed")
        current, rounds, rejected_in_a_row, stop = seed, [], 0, "round limit reached"
        for r in range(1, self.cfg.train.rounds + 1):
            record = records.load(self.store, self.run_id, RoundRecord, f"r{r}")
            if record is None:
                record = await self._round(r, current)
                records.put(self.store, self.run_id, f"r{r}", record)
            rounds.append(record)
            current = self.store.load_version(record.harness_after)
            if record.stop is not None:
                stop = record.stop
                break
            rejected_in_a_row = 0 if record.accepted else rejected_in_a_row + 1
            if rejected_in_a_row >= 2:
                stop = "nothing accepted twice in a row"
                break
        return current, rounds, stop

    async def val_scores(self, seed: HarnessVersion, final: HarnessVersion) -> tuple[float | None, float | None]:
        """Val accuracy of the seed and the final harness (read back when acceptance already ran them)."""
        tasks = self.val_tasks or self.ws.tasks("val", self.cfg.train.val_limit)
        if not tasks:
            return None, None
        trials = self.cfg.train.train_trials
        before = await self._timed("val/seed", lambda: self.runner.evaluate(seed, tasks, trials, "val", "val"))
        after = await self._timed("val/final", lambda: self.runner.evaluate(final, tasks, trials, "val", "val"))
        return before.accuracy, after.accuracy

    async def freeze_and_test(self, seed: HarnessVersion, final: HarnessVersion,
                              test_seed: bool = True) -> tuple[Path, dict[str, Any] | None, dict[str, Any]]:
        """Write the frozen harness and evaluate it (and the seed) on the held-out test split."""
        frozen = final.write(self.cfg.run.run_dir / "frozen" / final.id)
        test_tasks = self.ws.tasks("test", self.cfg.train.test_limit)
        trials = self.cfg.eval.trials

        async def test(version: HarnessVersion) -> dict[str, Any]:
            return (await self.test_runner.evaluate(version, test_tasks, trials, "test", "test")).to_dict()

        before = await self._timed("test/seed", lambda: test(seed)) if test_seed else None
        after = await self._timed("test/final", lambda: test(final))
        return frozen, before, after
