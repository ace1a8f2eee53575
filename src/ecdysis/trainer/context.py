"""What every training arm shares: its config, store, runners, role models, splits, timings and grounding.

`TrainContext` is built from the arm's own config (never the workspace's: `arm_workspace` gives a view
of the workspace with that config, so nothing shared is mutated); `Engine` (engine.py) runs the loop on it.
The test split is loaded only after training, in `freeze_and_test`: no optimizer role can see it.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from ..agent.trajectory import INFRA_ERROR, Trajectory
from ..config import Config
from ..envs.base import Task
from ..harness.manifest import HarnessVersion
from ..models.base import ChatRequest, ChatResponse
from ..models.cache import MeteredModel
from ..runner.runner import Runner
from ..workspace import Workspace
from . import holdout, records
from .charged import REPLAYS, stored_replays
from .failures import Pattern, aggregate, expected_text, failure_record
from .fdcr import DEBATE_ROLES
from .implement import ExternalCommand, Implementer
from .levers import Measurement, attach, measure_repairs, measurement_records
from .records import AcceptRule
from .rerun import runner_rerun
from .shared_seed import SharedSeed
from .sizing import advise
from .view import TrainView

T = TypeVar("T")
ROLES = (*DEBATE_ROLES, "moderator", "implementer")


def metered_role(ws: Workspace, config: Config, run_id: str, role: str, model_of: str | None = None) -> MeteredModel:
    """A run's client for an optimizer role (the model configured for `model_of`, default the role itself): the
    workspace's backend and cache, every call recorded in the run's accounting under `role`."""
    shared = ws.model(config.role_model(model_of or role), role=role, cache_scope=config.cache.training_scope)

    def record(role_name: str, request: ChatRequest, response: ChatResponse) -> None:
        ws.store.record_call(run_id, None, role_name, response.model_id, response.usage.prompt_tokens,
                             response.usage.completion_tokens, response.latency_s, response.cost_usd,
                             response.cache_hit, response.usage.cached_tokens, response.charged_s,
                             response.request_key, response.usage.constrained_tokens)

    return MeteredModel(shared.model, cache=shared.cache, role=role, scope=shared.scope,
                        listeners=[*shared.listeners, record])


async def freeze_and_test(ws: Workspace, config: Config, run_id: str, seed: HarnessVersion, final: HarnessVersion,
                          timed: Callable[[str, Callable[[], Awaitable[Any]]], Awaitable[Any]] | None = None,
                          test_seed: bool = True) -> tuple[Path, dict[str, Any] | None, dict[str, Any]]:
    """Write the frozen harness and evaluate it (and the seed) on the held-out test split, loaded only now: no
    optimizer role can have seen it. `timed` wraps each evaluation (the engine times its steps)."""
    frozen = final.write(config.run.run_dir / "frozen" / final.id)
    test_tasks, runner = ws.tasks("test", config.train.test_limit), ws.runner(run_id)

    async def test(version: HarnessVersion) -> dict[str, Any]:
        return (await runner.evaluate(version, test_tasks, config.eval.trials, "test", "test")).to_dict()

    async def run(key: str, version: HarnessVersion) -> dict[str, Any]:
        return await (timed(key, lambda: test(version)) if timed else test(version))

    before = await run("test/seed", seed) if test_seed else None
    return frozen, before, await run("test/final", final)


def outcomes(trajectories: list[Trajectory]) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    for t in trajectories:
        trials, passes = out.get(t.task_id, (0, 0))
        out[t.task_id] = (trials + 1, passes + int(t.passed))
    return out


def arm_workspace(ws: Workspace, config: Config) -> Workspace:
    """A view of `ws` running under `config`: same store, cache, executor and backends; `ws` is untouched."""
    if config is ws.config:
        return ws
    _ = ws.store, ws.cache, ws.executor  # opened once, shared by the view
    view = copy.copy(ws)
    view.config = config
    return view


class TrainContext:
    """One training run of one arm: plumbing shared by every proposer."""

    def __init__(self, ws: Workspace, run_id: str, arm: str, config: Config | None = None,
                 view: TrainView | None = None, shared_seed: SharedSeed | None = None) -> None:
        self.ws = arm_workspace(ws, config or ws.config)
        self.cfg, self.run_id, self.arm = self.ws.config, run_id, arm
        self.store = self.ws.store
        self.view = view or TrainView(enabled=False)
        self.runner: Runner = self.ws.runner(run_id, cache_scope=self.cfg.cache.training_scope)
        self.shared_seed = shared_seed  # the seed evaluation this arm shares with the compare seed's others
        self.seed_runner: Runner | None = shared_seed.runner(self.ws) if shared_seed else None
        if shared_seed is not None:
            self.runner = shared_seed.reading(self.runner)
        self.replays_before = stored_replays(self.store, run_id)
        self.roles: dict[str, MeteredModel] = {r: self._role_model(r) for r in ROLES}
        self.train_tasks: list[Task] = self.ws.tasks("train", self.cfg.train.train_limit)
        for split, n in (("train", len(self.train_tasks)), ("test", len(self.ws.tasks("test", 1)))):
            if not n:  # refused before anything is spent: no failures to learn from, or no held-out result
                raise ValueError(f"the {split} split of environment {self.cfg.env.name!r} has no tasks; training "
                                 "needs train tasks to learn from and test tasks to measure the result on "
                                 "(a JSONL suite: more tasks, or \"split\" fields on its lines)")
        self.val_tasks, self.accept_rule = self._acceptance_split()
        records.put(self.store, run_id, "accept_on", self.accept_rule)
        self.wall_done = sum(v for k, v in self.store.records(run_id, "timing") if k.startswith("r"))
        self._step_started: float | None = None

    def _acceptance_split(self) -> tuple[list[Task], AcceptRule]:
        """The tasks edits are accepted on, and the rule as recorded with the run."""
        t = self.cfg.train
        val = self.ws.tasks("val", t.val_limit) if t.accept_on != "train" else []
        if t.accept_on == "val" and len(val) < t.min_val_tasks:
            raise ValueError(f"train.accept_on = 'val' but the environment has {len(val)} val task(s) "
                             f"(< train.min_val_tasks = {t.min_val_tasks}); use accept_on = 'train' or add val tasks")
        on_val = t.accept_on != "train" and len(val) >= t.min_val_tasks
        why = ("decided on held-out val tasks; optimizer roles see only aggregate val scores" if on_val
               else "configured" if t.accept_on == "train"
               else f"only {len(val)} val task(s) (< {t.min_val_tasks}): deciding on the training tasks")
        n = len(val) if on_val else len(self.train_tasks)
        pool = len(self.ws.tasks("train", None)) + len(self.ws.tasks("val", None))  # not the limits: what there is
        advice = advise(n, pool, t.min_effect, t.alpha, t.acceptance)
        if advice.warning:
            self.view.note(f"[yellow]acceptance split: {advice.warning}[/]")
        if self.stochastic() and t.train_trials == 1:
            self.view.note("[yellow]episodes are stochastic (sampling temperature or a simulated user) and "
                           "train.train_trials = 1: the noise floor is not measured; the sequential test stays exact, "
                           "set train.train_trials = 3 to measure the noise and report pass^k[/]")
        rule = AcceptRule(accept_on="val" if on_val else "train", tasks=n, rule=t.acceptance, why=why,
                          alpha=t.alpha if t.acceptance == "sequential" else None, detectable=advice.detectable,
                          proposed=advice.proposed, warning=advice.warning)
        return (val if on_val else []), rule

    def stochastic(self) -> bool:
        """Whether the seed harness's episodes are random: sampling temperature, self-consistency samples, or a
        simulated user at a temperature above 0."""
        gen = self.ws.harness().manifest.generation
        user = getattr(self.ws.env, "conversational", False) and self.cfg.user.temperature > 0
        return gen.temperature > 0 or (gen.samples > 1 and gen.sample_temperature > 0) or bool(user)

    @property
    def accept_split(self) -> str:
        return "val" if self.val_tasks else "train"

    def implementer(self) -> Implementer:
        """Builds candidates from specs: the implementer role, or the configured external command."""
        return Implementer(self.roles["implementer"], self.ws.env, self.train_tasks, self.runner.limits,
                           self.cfg.train.implement_attempts, ExternalCommand.from_config(self.cfg.train),
                           rerun=runner_rerun(self.runner))

    def _role_model(self, role: str) -> MeteredModel:
        return metered_role(self.ws, self.cfg, self.run_id, role)

    def wall_s(self) -> float:
        """Training wall time so far: the finished timed steps plus the one running."""
        running = time.perf_counter() - self._step_started if self._step_started is not None else 0.0
        return self.wall_done + running

    def replays(self) -> int:
        """Replays of stored episodes this run made (grounding, candidate checks), over its processes."""
        return self.replays_before + self.runner.replays

    async def _timed(self, key: str, step: Callable[[], Awaitable[T]]) -> T:
        """Run one step and add its wall time to the `timing` record `key` (steps are never nested)."""
        start = self._step_started = time.perf_counter()
        try:
            return await step()
        finally:
            elapsed = time.perf_counter() - start
            self._step_started = None
            previous = self.store.get_record(self.run_id, "timing", key) or 0.0
            self.store.put_record(self.run_id, "timing", key, previous + elapsed)
            self.store.put_record(self.run_id, *REPLAYS, self.replays())
            if key.startswith("r"):
                self.wall_done += elapsed

    def patterns_of(self, trajectories: list[Trajectory]) -> list[Pattern]:
        gold = {t.id: t.gold for t in self.train_tasks}
        threshold = self.cfg.train.failure_threshold
        failures = [failure_record(t, gold[t.task_id]) for t in trajectories if t.score < threshold]
        expected = {t.id: expected_text(t.gold) for t in self.train_tasks}  # per-label error rates
        return aggregate(failures, outcomes(trajectories), self.cfg.train.max_evidence_per_pattern,
                         expected_of=expected)

    async def grounded_patterns(self, key: str, current: HarnessVersion, trajectories: list[Trajectory]
                                ) -> tuple[list[Pattern], list[Measurement]]:
        """Aggregate, then measure every built-in repair on the stored replies and rank the patterns
        (stored under `key`, so a resumed run reads them back; a harness measured in an earlier step, on the
        same training evaluation, is not replayed again)."""
        trajectories = [t for t in trajectories if t.termination != INFRA_ERROR]
        stored = self.store.get_record(self.run_id, "patterns", key)
        measured = self.store.get_record(self.run_id, "measurements", key)
        if stored is not None and measured is not None:
            return [Pattern.from_dict(d) for d in stored], [Measurement.from_record(m) for m in measured]
        tasks = {t.id: t for t in self.train_tasks}
        same = self.store.get_record(self.run_id, "measurements", f"harness/{current.id}")  # measured before
        if same is not None:
            measurements = [Measurement.from_record(m) for m in same]
        else:
            measurements = await self._timed(f"{key}/measure", lambda: measure_repairs(
                current, trajectories, self.ws.env, tasks, self.runner.limits,
                rerun=runner_rerun(self.runner)))
            self.store.put_record(self.run_id, "measurements", f"harness/{current.id}",
                                  measurement_records(measurements))
        self.store.put_record(self.run_id, "measurements", key, measurement_records(measurements))
        patterns = attach(self.patterns_of(trajectories), measurements, trajectories, tasks)
        self.store.put_record(self.run_id, "patterns", key, [p.to_dict() for p in patterns])
        return patterns, measurements

    async def holdout_check(self, seed: HarnessVersion, final: HarnessVersion) -> holdout.HoldoutCheck | None:
        """The final-selection check (holdout.py) on the val tasks beyond the acceptance split, recorded with the
        run (timed, not charged to the training budget); None when there is nothing to check."""
        tasks = holdout.holdout_tasks(self.ws.tasks("val", None), self.val_tasks, self.cfg.train)
        result = await self._timed("holdout", lambda: holdout.check(self.runner, seed, final, tasks,
                                                                    self.cfg.train.train_trials,
                                                                    self.cfg.train.alpha))
        if result is not None:
            self.store.put_record(self.run_id, "holdout", "check", result.model_dump(mode="json"))
            self.view.note(("[yellow]" if result.kept == "seed" else "[dim]") + result.line() + "[/]")
        return result

    async def freeze_and_test(self, seed: HarnessVersion, final: HarnessVersion,
                              test_seed: bool = True) -> tuple[Path, dict[str, Any] | None, dict[str, Any]]:
        """Write the frozen harness and evaluate it (and the seed) on the held-out test split (timed)."""
        return await freeze_and_test(self.ws, self.cfg, self.run_id, seed, final, self._timed, test_seed)
