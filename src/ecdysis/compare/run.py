"""`ecdysis compare`: every arm on the same tasks, models, cache, store and shared training budget.

Arms are objects built from an explicit config (`build_arms`); no arm changes the workspace's config. The
arms are the declared methods (methods.py), run in declaration order; how an arm runs follows its method's
`runs`: evaluate (direct, fixed), engine (serial, serial+library, aggregate, ecdysis), gepa (GEPA through the
`gepa` package), sample (best-of-k: the fixed harness sampled k times per test task, majority vote without
gold). The training arms share `train.budget` (agent executions, optimizer tokens, charged seconds) and, per
seed, the seed harness's train/val evaluation (`shared_seed.py`: run once, charged to every arm). best-of-k's k
is floor(ecdysis's training spend / one sampled pass over the test tasks), in tokens (prompt + completion as
the model reported them): the spend counts the fresh (non-response-cache) agent calls of ecdysis's training
evaluations, its test passes excluded, plus its optimizer roles' fresh tokens; the pass is one probe pass of
the sampled harness. k is capped at `eval.best_of_k_max`; the result keeps the uncapped k. Every arm's row
keeps its per-task test scores (`test_per_task`: the paired differences of compare/factorial.py).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from ..agent.trajectory import INFRA_ERROR, Trajectory
from ..config import Config
from ..harness.manifest import HarnessVersion, set_manifest_value, version_from_files
from ..models.charge import rates
from ..runner.failures import GraderFailed
from ..trainer.api import config_key, train_async
from ..trainer.budget import agent_tokens, cached
from ..trainer.gepa_arm import train_gepa
from ..trainer.methods import METHODS, Runs
from ..trainer.result import TrainResult
from ..trainer.shared_seed import SharedSeed
from ..workspace import Workspace
from .files import write_results
from .results import ArmResult, add_ratios

__all__ = ["ARMS", "ArmResult", "CompareArm", "build_arms", "compare", "write_results"]
ARMS = tuple(METHODS)  # the methods declared in ecdysis (build_arms reads the registry itself)


@dataclass
class Context:
    """What one seed's arms share: the workspace, the transfer model, the training spend (agent and optimizer
    tokens) of every arm run so far (best-of-k is matched to ecdysis's), the seed evaluation of the training arms."""

    ws: Workspace
    transfer_model: str | None = None
    spend: dict[str, int] = field(default_factory=dict)
    shared_seed: SharedSeed | None = None


@dataclass
class CompareArm:
    """One arm of a compare, with its own config (per-arm cache scope); `run` returns its result and the
    harness it froze."""

    name: str
    config: Config

    async def run(self, ctx: Context) -> tuple[ArmResult, HarnessVersion]:
        raise NotImplementedError

    def start_run(self, ws: Workspace) -> str:
        """The arm's own run in the store, stable per arm, seed and config (a rerun resumes it)."""
        cfg = self.config
        return ws.store.start_run("compare-arm", {"arm": self.name, "seed": cfg.run.seed},
                                  run_id=f"{self.name}-seed{cfg.run.seed}-{config_key(cfg, length=8)}")


def arm_config(config: Config, arm: str) -> Config:
    """A copy of `config` for one arm: when `cache.isolate_arms`, a cache scope per arm, seed and config, so a
    rerun of the same compare resumes from its own entries and another config pays for its training again."""
    cfg = config.model_copy(deep=True)
    if cfg.cache.isolate_arms:
        cfg.cache.training_scope = f"{arm}/seed{cfg.run.seed}/{config_key(config, length=8)}"
    return cfg


def bare_harness(env: str) -> HarnessVersion:
    """The `direct` arm: no contract, skills, demos, validation or regulation; the reply is the answer."""
    manifest = (f'name = "direct"\nenv = "{env}"\n\n[budget]\nmax_turns = 1\nmax_rejections = 0\n\n'
                '[files]\ncontract = ""\nskills = ""\ndemos = ""\naction = ""\nregulate = ""\n')
    return version_from_files({"harness.toml": manifest}, origin="direct")


def arm_result(result: TrainResult, seed: int) -> ArmResult:
    """A training arm's row (the engine's arms and gepa report the same `TrainResult`)."""
    accepted, rejected = result.decisions()
    test = result.test_after or {}
    sent = sum(p for p, _ in result.prompt_cache.values())
    out = ArmResult(
        result.arm, seed, result.wall_s, result.agent_executions, result.cached_executions, result.optimizer_calls,
        result.optimizer_tokens, result.training_agent_tokens, accepted, rejected, train_acc=result.train_after,
        val_acc=result.val_after, test_acc=test.get("accuracy", 0.0), pass_at_k=test.get("pass_at_k", 0.0),
        pass_hat_k=test.get("pass_hat_k", 0.0), harness_id=result.final_harness_id, stop_reason=result.stop_reason,
        curve=sorted(result.curve, key=lambda p: p.step),
        prefix_cache_rate=sum(c for _, c in result.prompt_cache.values()) / sent if sent else None,
        train_charged_s=result.charged_s, budget_s=result.budget.wall_s, test_per_task=per_task_scores(test),
        charged_parts=result.charged_parts, cold_tokens=result.cold_tokens,
        step_outcomes={k: list(v) for k, v in result.step_outcomes.items()})
    out.gap = None if result.train_after is None else result.train_after - out.test_acc
    return out


@dataclass
class BaselineArm(CompareArm):
    """direct / fixed: the bare or the seed harness evaluated on train and test, never changed."""

    async def run(self, ctx: Context) -> tuple[ArmResult, HarnessVersion]:
        ws, cfg = ctx.ws, self.config
        run_id = self.start_run(ws)
        version = bare_harness(cfg.env.name) if self.name == "direct" else ws.harness()
        runner = ws.runner(run_id)
        train = await runner.evaluate(version, ws.tasks("train", cfg.train.train_limit), cfg.train.train_trials,
                                      "train", "train")
        test = await runner.evaluate(version, ws.tasks("test", cfg.train.test_limit), cfg.eval.trials, "test", "test")
        for split, summary in (("train", train), ("test", test)):  # no arm is compared on a grader's failures
            if summary.failures.grader_errors:
                raise GraderFailed(split, summary.episodes, summary.failures)
        result = ArmResult(self.name, cfg.run.seed, train_acc=train.accuracy, test_acc=test.accuracy,
                           gap=train.accuracy - test.accuracy, pass_at_k=test.pass_at_k, pass_hat_k=test.pass_hat_k,
                           harness_id=version.id, test_per_task=per_task_scores(test.to_dict()))
        ws.store.finish_run(run_id, result.row())
        return result, version


@dataclass
class TrainerArm(CompareArm):
    """A method that runs the training loop (serial, serial+library, aggregate, ecdysis), with this arm's config."""

    async def run(self, ctx: Context) -> tuple[ArmResult, HarnessVersion]:
        result = await train_async(self.config, self.name, ws=ctx.ws, shared_seed=ctx.shared_seed)
        return arm_result(result, self.config.run.seed), ctx.ws.store.load_version(result.final_harness_id)


@dataclass
class GepaArm(CompareArm):
    """gepa: GEPA's own loop through our runner (trainer/gepa_arm.py)."""

    async def run(self, ctx: Context) -> tuple[ArmResult, HarnessVersion]:
        result = await train_gepa(self.config, ctx.ws, ctx.shared_seed)
        return arm_result(result, self.config.run.seed), ctx.ws.store.load_version(result.final_harness_id)


def best_of_k(spend: int, per_trial: int) -> int:
    """k = floor(spend / per_trial), at least 1 (a pass that cost nothing, or no spend, gives k = 1)."""
    return max(1, math.floor(spend / per_trial)) if per_trial > 0 else 1


def majority_vote(outcomes: list[Hashable]) -> Hashable | None:
    """The most frequent outcome; ties go to the one seen first (trial order); None when there are none."""
    return Counter(outcomes).most_common(1)[0][0] if outcomes else None


def episode_tokens(trajectories: list[Trajectory]) -> int:
    """Agent tokens the episodes' calls cost as the model reported them (a response-cache hit reports the
    original call's usage: what running the episode fresh costs)."""
    return sum(agent_tokens(t) for t in trajectories)


def per_task_scores(summary: dict[str, Any]) -> dict[str, float]:
    """Each test task's mean score over its trials, from an evaluation summary (`EvalSummary.to_dict()`)."""
    return {t: sum(v) / len(v) for t, v in (summary.get("per_task") or {}).items() if v}


def voted_per_task(ws: Workspace, trajectories: list[Trajectory], tasks: dict[str, Any]) -> dict[str, float]:
    """Each task's score (1/0) when its outcome is the majority vote of its trials (see `voted_accuracy`)."""
    return {task_id: voted_accuracy(ws, [t for t in trajectories if t.task_id == task_id], tasks)
            for task_id in sorted({t.task_id for t in trajectories if t.termination != INFRA_ERROR})}


def voted_accuracy(ws: Workspace, trajectories: list[Trajectory], tasks: dict[str, Any]) -> float:
    """Accuracy when each task's outcome is the majority (answer, final state) of its trials; no gold is
    used to select. Infra-lost episodes do not vote."""
    by_task: dict[str, list[Trajectory]] = {}
    for t in trajectories:
        if t.termination != INFRA_ERROR:
            by_task.setdefault(t.task_id, []).append(t)
    correct = 0
    for task_id, trajs in by_task.items():
        vote = majority_vote([(t.final_answer, json.dumps(t.final_state, sort_keys=True)) for t in
                              sorted(trajs, key=lambda t: t.trial) if t.final_answer is not None or t.final_state])
        if vote is not None:
            answer, state = vote  # type: ignore[misc]
            correct += ws.env.grade(tasks[task_id], answer, json.loads(state)).passed
    return correct / len(by_task) if by_task else 0.0


@dataclass
class BestOfKArm(CompareArm):
    """best-of-k: the fixed harness sampled k times per test task (test-time scaling at ecdysis's spend)."""

    async def run(self, ctx: Context) -> tuple[ArmResult, HarnessVersion]:
        ws, cfg = ctx.ws, self.config
        run_id = self.start_run(ws)
        seed = ws.harness()
        sampled = seed.with_files({"harness.toml": set_manifest_value(
            seed.files["harness.toml"], "generation", "temperature", cfg.eval.best_of_k_temperature)})
        tasks = ws.tasks("test", cfg.train.test_limit)
        runner = ws.runner(run_id)
        probe = await runner.evaluate(sampled, tasks, 1, "test", "test-probe")
        per_trial = episode_tokens(ws.store.trajectories(probe.eval_id))
        of = METHODS[self.name].spend_of
        spend = ctx.spend.get(of) if of else None
        if spend is None:
            ws.store.put_record(run_id, "note", self.name, f"no {of} arm ran before {self.name}: k = 1, "
                                "not matched to a training spend")
        k_uncapped = best_of_k(spend or 0, per_trial)
        k = min(k_uncapped, cfg.eval.best_of_k_max)
        summary = await runner.evaluate(sampled, tasks, k, "test", "test")
        voted = [t for t in ws.store.trajectories(summary.eval_id) if t.termination != INFRA_ERROR]
        trajectories = [t for t in ws.store.trajectories(probe.eval_id) if t.termination != INFRA_ERROR] + voted
        ran = sum(not cached(t) for t in trajectories)  # the probe's episodes are reused as trial 0 (cache hits)
        result = ArmResult(
            self.name, cfg.run.seed, agent_executions=ran, cached_executions=len(trajectories) - ran,
            agent_tokens=episode_tokens([t for t in trajectories if not cached(t)]),
            test_acc=voted_accuracy(ws, voted, {t.id: t for t in tasks}), pass_at_k=summary.pass_at_k,
            pass_hat_k=summary.pass_hat_k, k=k, k_uncapped=k_uncapped, harness_id=sampled.id,
            test_per_task=voted_per_task(ws, voted, {t.id: t for t in tasks}),
            stop_reason=(f"k capped at eval.best_of_k_max = {cfg.eval.best_of_k_max} (uncapped {k_uncapped})"
                         if k < k_uncapped else ""))
        ws.store.finish_run(run_id, result.row())
        return result, sampled


RUNNERS: dict[Runs, type[CompareArm]] = {"evaluate": BaselineArm, "engine": TrainerArm, "gepa": GepaArm,
                                  "sample": BestOfKArm}


def arm_class(name: str) -> type[CompareArm]:
    return RUNNERS[METHODS[name].runs]


def build_arms(config: Config, names: list[str]) -> list[CompareArm]:
    """The named arms in declaration order (a method is declared after the one whose spend it is matched to),
    each with its own config copy. ValueError for an unknown name."""
    unknown = [a for a in names if a not in METHODS]
    if unknown:
        raise ValueError(f"unknown arm(s) {unknown}; known: {', '.join(METHODS)}")
    return [arm_class(a)(a, arm_config(config, a)) for a in METHODS if a in names]


async def compare(config: Config, arms: list[str], seeds: int = 1, transfer_model: str | None = None,
                  open_workspace: Callable[[Config], Workspace] = Workspace.open) -> list[ArmResult]:
    """Every arm for each of `seeds` seeds (run.seed, +1, ...); results with ratios and curve-read times."""
    build_arms(config, arms)  # names checked before anything runs
    results: list[ArmResult] = []
    for offset in range(seeds):
        cfg = config.model_copy(deep=True)
        cfg.run.seed = config.run.seed + offset
        ws = open_workspace(cfg)
        ctx = Context(ws, transfer_model, shared_seed=SharedSeed.for_seed(cfg.run.seed, config_key(cfg, length=8)))
        seed_results: list[ArmResult] = []
        try:
            for arm in build_arms(cfg, arms):
                result, version = await arm.run(ctx)
                result.rates_version = rates().version  # charged seconds compare only under one table
                ctx.spend[arm.name] = result.training_tokens()  # as a cold run spends them, whatever was cached
                if transfer_model:
                    result.transfer_acc = await _transfer(ws, arm, version, transfer_model)
                seed_results.append(result)
                _record(ws, result)  # a seed killed in a later arm still shows this one
            add_ratios(seed_results)  # ratios are per seed
            for result in seed_results:  # the report reads these
                _record(ws, result)
        finally:
            ws.close()
        results += seed_results
    return results


def _record(ws: Workspace, result: ArmResult) -> None:
    """An arm's row and curve in the compare's store (`compare.files.stored_results` reads them back)."""
    key = f"{result.arm}/seed{result.seed}"
    ws.store.put_record("compare", "arm", key, result.row())
    ws.store.put_record("compare", "curve", key, [p.model_dump(mode="json") for p in result.curve])


async def _transfer(ws: Workspace, arm: CompareArm, version: HarnessVersion, model: str) -> float:
    """Test accuracy of the arm's frozen harness with a second agent model."""
    seed = arm.config.run.seed
    run_id = f"transfer-{arm.name}-seed{seed}"
    ws.store.start_run("transfer", {"arm": arm.name, "model": model}, run_id=run_id)
    summary = await ws.runner(run_id, model_ref=model).evaluate(
        version, ws.tasks("test", arm.config.train.test_limit), 1, "test", "transfer")
    ws.store.finish_run(run_id, summary.to_dict())
    return summary.accuracy

