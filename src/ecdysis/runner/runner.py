"""The runner: the one place that evaluates a harness on tasks.

It owns concurrency (a semaphore), caching and accounting (through `MeteredModel`), budgets,
sandboxing (one worker per episode), grading (host side) and recording (the run store, as each
trajectory arrives). An evaluation's id is derived from its inputs, so re-running the same
evaluation in the same run directory resumes it: finished (task, trial) pairs are not repeated.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from math import comb
from typing import Any

from rich.console import Console

from ..agent.trajectory import INFRA_ERROR, Trajectory
from ..envs.base import Environment, Score, Task
from ..harness.manifest import HarnessVersion
from ..models.base import ChatRequest, GenerationParams, Message, ModelError
from ..models.cache import MeteredModel
from ..sandbox.confine import bwrap_path
from ..sandbox.host import SandboxLimits
from ..store.db import RunStore
from .episode_job import EpisodeJob
from .executors import Executor, LocalExecutor
from .failures import FailureCounts, count_failures, grader_error_of
from .progress import EvalProgress
from .user_sim import UserSimulator


@dataclass
class EvalSummary:
    eval_id: str
    harness_id: str
    split: str
    n_tasks: int
    trials: int
    accuracy: float
    pass_at_k: float
    pass_hat_k: float
    terminations: dict[str, int]
    prompt_tokens: int
    completion_tokens: int
    model_calls: int
    cache_hits: int
    model_time_s: float
    wall_s: float
    episodes: int
    per_task: dict[str, list[float]] = field(default_factory=dict)
    infra_failures: int = 0  # episodes lost by the infrastructure (not scored; retried on the next run)
    model_retries: int = 0  # retried model requests (429s, 5xx, timeouts, malformed bodies) behind the replies
    cached_prompt_tokens: int = 0  # prompt tokens the backend served from its prefix cache (not processed again)
    failures: FailureCounts = field(default_factory=FailureCounts)  # by kind, each with its first message

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()} | {"failures": self.failures.to_dict()}


def grade_safely(env: Environment, task: Task, traj: Trajectory) -> Score:
    """Grade in the host. A grader that raises, or returns anything but a `Score` whose value is a finite number,
    is a grader error: the episode scores 0 with the error kept (`Score.grader_error`), counted apart from
    wrong answers."""
    state = {**traj.final_state, "conversation": traj.conversation, "termination": traj.termination}
    try:
        score = env.grade(task, traj.final_answer, state)
    except Exception as exc:  # noqa: BLE001 - a grader bug must not abort the batch
        return Score.grader_error(f"grader raised {type(exc).__name__}: {exc}")
    if not isinstance(score, Score):
        return Score.grader_error(f"{type(env).__name__}.grade returned {type(score).__name__} {score!r:.60}, "
                                  "not a Score")
    value = score.value
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return Score.grader_error(f"{type(env).__name__}.grade gave the score value {value!r:.60}; a Score's value "
                                  "is a finite number")
    return score


def regrade_grader_errors(store: RunStore, env: Environment, eval_id: str, tasks: list[Task]) -> int:
    """Grade again the stored episodes of `eval_id` the grader failed on (it may have been fixed since); no
    model calls. Returns how many were graded again."""
    by_id = {t.id: t for t in tasks}
    regraded = 0
    for traj in store.trajectories(eval_id):
        if grader_error_of(traj) is None or traj.task_id not in by_id:
            continue
        score = grade_safely(env, by_id[traj.task_id], traj)
        traj.score, traj.passed = score.value, score.passed
        traj.score_detail, traj.score_components = score.detail, score.components
        store.record_trajectory(eval_id, traj)
        regraded += 1
    return regraded


def pass_at_k(n: int, c: int, k: int) -> float:
    return 1.0 if n - c < k else 1.0 - comb(n - c, k) / comb(n, k)


def pass_hat_k(n: int, c: int, k: int) -> float:
    return comb(c, k) / comb(n, k)


def summarize(eval_id: str, harness_id: str, split: str, trials: int,
              recorded: list[Trajectory], wall_s: float, not_run: int = 0, not_run_reason: str = "") -> EvalSummary:
    """Scores over the episodes that ran; episodes the infrastructure lost are counted apart, and every failure
    (grader errors, crashes, budget stops, timeouts, model errors, lost episodes; `not_run` episodes the budget
    left unrun) is counted by kind (`failures.count_failures`)."""
    trajectories = [t for t in recorded if t.termination != INFRA_ERROR]
    per_task: dict[str, list[float]] = {}
    for t in trajectories:
        per_task.setdefault(t.task_id, []).append(t.score)
    k = trials
    at_k = [pass_at_k(len(s), sum(x >= 1.0 for x in s), min(k, len(s))) for s in per_task.values()]
    hat_k = [pass_hat_k(len(s), sum(x >= 1.0 for x in s), min(k, len(s))) for s in per_task.values()]
    n = len(trajectories)
    return EvalSummary(
        eval_id=eval_id, harness_id=harness_id, split=split, n_tasks=len(per_task), trials=trials,
        accuracy=sum(t.score for t in trajectories) / n if n else 0.0,
        pass_at_k=sum(at_k) / len(at_k) if at_k else 0.0,
        pass_hat_k=sum(hat_k) / len(hat_k) if hat_k else 0.0,
        terminations=dict(Counter(t.termination for t in trajectories)),
        prompt_tokens=sum(t.prompt_tokens for t in trajectories),
        completion_tokens=sum(t.completion_tokens for t in trajectories),
        model_calls=sum(t.model_calls for t in trajectories),
        cache_hits=sum(t.cache_hits for t in trajectories),
        model_time_s=sum(t.model_time_s for t in trajectories),
        wall_s=wall_s, episodes=n, per_task=per_task, infra_failures=len(recorded) - n,
        model_retries=sum(int(e.get("retries", 0)) for t in trajectories for e in t.of_kind("model")),
        cached_prompt_tokens=sum(int((e.get("usage") or {}).get("cached_tokens", 0)) for t in trajectories
                                 for e in t.of_kind("model") if not e.get("cache_hit")),
        failures=count_failures(recorded, not_run, not_run_reason),
    )


@dataclass
class Runner:
    store: RunStore
    run_id: str
    model: MeteredModel
    env: Environment
    env_name: str
    env_options: dict[str, Any] = field(default_factory=dict)
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    concurrency: int = 2
    show_progress: bool = True
    max_agent_tokens: int | None = None  # budget across all evaluations of this runner
    tokens_spent: int = 0
    user_model: MeteredModel | None = None  # the simulated user of conversation tasks
    user_settings: dict[str, Any] = field(default_factory=dict)  # UserSimulator fields: max_turns, temperature...
    plugin_paths: list[str] = field(default_factory=list)  # import path the sandbox needs for the env plugin
    executor: Executor = field(default_factory=LocalExecutor)  # where episodes run (local processes, Ray)
    replays: int = 0  # sandboxed re-runs of stored episodes (trainer/rerun.py), charged like an episode's sandbox
    _warned: bool = False

    def eval_id(self, harness: HarnessVersion, tasks: list[Task], trials: int, label: str) -> str:
        h = hashlib.sha256()
        for part in (self.run_id, harness.id, self.model.identity, self.env_name, label, str(trials)):
            h.update(part.encode() + b"\0")
        for task in tasks:
            h.update(task.id.encode() + b"\0")
        return h.hexdigest()[:16]

    async def _chat(self, eval_id: str, split: str, messages: list[dict[str, Any]],
                    params: dict[str, Any]) -> dict[str, Any]:
        """Serve one model call of an episode of an evaluation on `split` (its cache partition). Once the run's
        `max_agent_tokens` are spent, every call is refused, whoever in the sandbox makes it (the episode ends
        `budget`)."""
        if self._over_budget():
            return {"refused": f"run.max_agent_tokens ({self.max_agent_tokens}) spent: the model call was refused"}
        try:
            request = ChatRequest(messages=[Message(**m) for m in messages], params=GenerationParams(**params))
            response = await self.model.chat(request, partition=split)
        except (ModelError, ValueError, TypeError) as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}
        self.store.record_call(self.run_id, eval_id, self.model.role, self.model.identity,
                               response.usage.prompt_tokens, response.usage.completion_tokens,
                               response.latency_s, response.cost_usd, response.cache_hit,
                               response.usage.cached_tokens, response.charged_s, response.request_key,
                               response.usage.constrained_tokens)
        if not response.cache_hit:
            self.tokens_spent += response.usage.total_tokens
        return {"text": response.text, "tool_calls": [c.model_dump() for c in response.tool_calls],
                "finish_reason": response.finish_reason, "usage": response.usage.model_dump(),
                "latency_s": response.latency_s, "cache_hit": response.cache_hit, "retries": response.retries}

    def _user(self, eval_id: str, task: Task, session: str, split: str = "") -> Any:
        """The host-side handler of a conversation task's user turns (cached in `split`'s partition), or None."""
        if task.user_scenario is None or self.user_model is None:
            return None
        sim = UserSimulator(self.user_model, task.user_scenario, session=session, partition=split,
                            **self.user_settings)
        model = self.user_model

        async def handle(conversation: list[dict[str, str]]) -> dict[str, Any]:
            out = await sim.reply(conversation)
            if "usage" in out:
                u = out["usage"]
                self.store.record_call(self.run_id, eval_id, "user", model.identity, u["prompt_tokens"],
                                       u["completion_tokens"], out["latency_s"], 0.0, out["cache_hit"],
                                       u.get("cached_tokens", 0), out.get("charged_s", 0.0),
                                       out.get("request_key", ""), u.get("constrained_tokens", 0))
            return out

        return handle

    def episode(self, harness: HarnessVersion, task: Task, trial: int) -> EpisodeJob:
        """One episode as an executor runs it: the sandbox sees the plugin's code from `plugin_paths`, the
        environment's `sandbox_files` read-only and its `sandbox_hidden` masked (read now: they may change)."""
        return EpisodeJob(harness, self.env_name, self.env_options, task, trial, self.limits, self.plugin_paths,
                       [str(p) for p in getattr(self.env, "sandbox_hidden", ()) or ()],
                       [str(p) for p in getattr(self.env, "sandbox_files", ()) or ()])

    def _over_budget(self) -> bool:
        return self.max_agent_tokens is not None and self.tokens_spent >= self.max_agent_tokens

    async def evaluate(self, harness: HarnessVersion, tasks: list[Task], trials: int = 1,
                       split: str = "", label: str = "eval", stop: Callable[[], bool] | None = None) -> EvalSummary:
        """Run every (task, trial) not yet recorded for this evaluation; return the full summary. `stop` is
        asked before each episode starts: once it says True no new episode starts (a spent training budget)."""
        eval_id = self.eval_id(harness, tasks, trials, label)
        if not self._warned and bwrap_path() is None:
            self._warned = True
            Console(stderr=True).print(
                "[bold yellow]warning: bubblewrap (bwrap) is not available: harness code runs with in-process "
                "measures only (rlimits, audit hook, a network namespace if root), which hostile code can escape. "
                "Install the Debian package `bubblewrap` (make setup does). Each trajectory records its isolation.[/]")
        self.store.save_version(harness)
        self.store.open_evaluation(eval_id, self.run_id, harness.id, self.model.identity, self.env_name,
                                   split, trials, len(tasks), label)
        regrade_grader_errors(self.store, self.env, eval_id, tasks)  # a fixed grader: graded again, nothing re-run
        done = self.store.done_keys(eval_id)
        todo = [(t, k) for k in range(trials) for t in tasks if (t.id, k) not in done]
        start = time.perf_counter()
        semaphore = asyncio.Semaphore(self.concurrency)
        progress = EvalProgress(f"{label} [{harness.id[:8]}]", total=len(tasks) * trials,
                                done=len(done), enabled=self.show_progress)

        async def one(task: Task, trial: int) -> None:
            async with semaphore:
                if self._over_budget() or (stop is not None and stop()):
                    return
                session = f"{eval_id}/{task.id}/{trial}"  # one episode: its model calls keep one local context
                episode = self.episode(harness, task, trial)
                try:
                    traj = await self.executor.run(
                        episode, lambda m, p: self._chat(eval_id, split, m, {**p, "session": session}),
                        self._user(eval_id, task, session, split))
                finally:  # per-episode backend state (an embedded model's context) is free for the next one
                    self.model.release(session)
                    if self.user_model is not None:
                        self.user_model.release(session)
                if traj.termination != INFRA_ERROR:  # not the harness's doing: kept out of scores, retried on rerun
                    score = grade_safely(self.env, task, traj)
                    traj.score, traj.passed = score.value, score.passed
                    traj.score_detail, traj.score_components = score.detail, score.components
                self.store.record_trajectory(eval_id, traj)
                progress.advance(traj)

        try:
            with progress:
                await asyncio.gather(*(one(t, k) for t, k in todo))
        finally:
            await self.executor.idle()
        trajectories = self.store.trajectories(eval_id)
        unrun = len(tasks) * trials - len(trajectories) if self._over_budget() else 0
        summary = summarize(eval_id, harness.id, split, trials, trajectories, time.perf_counter() - start,
                            unrun, f"run.max_agent_tokens ({self.max_agent_tokens}) spent")
        complete = summary.episodes == len(tasks) * trials
        record = summary.to_dict() | {"complete": complete, "budget_exhausted": self._over_budget()}
        self.store.finish_evaluation(eval_id, record)
        return summary
