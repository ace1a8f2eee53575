"""GEPA's side of the gepa arm: the harness's text layers as GEPA components, the thread/loop bridge, the
adapter that runs candidates through our runner, and the reflection LM over our model layer.

The adapter's `evaluate` is called from GEPA's worker thread; all of its work (runner, store, models) is
submitted to the event loop through `LoopBridge`, so the store and the models are only used there.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import re
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..agent.trajectory import INFRA_ERROR, Trajectory
from ..envs.base import Task
from ..harness.manifest import HarnessVersion
from ..harness.skills import parse_skills
from ..models.base import ChatRequest, GenerationParams, Message
from ..models.cache import MeteredModel
from ..runner.runner import Runner
from .budget import cached
from .checks import CheckFailed, check_static
from .failures import failure_record

T = TypeVar("T")
ARM = "gepa"
MAX_TIPS = 8
MAX_EXAMPLES = 4  # reflective records per component (failures first)
TEXT = 700  # characters of task text / reply shown to the reflection LM

class GepaStopped(RuntimeError):
    """The event loop side is gone (cancelled or finished): the GEPA thread stops at its next call."""


# ---- components <-> harness ------------------------------------------------------------------------------

def text_components(version: HarnessVersion) -> dict[str, str]:
    """The harness's text layers as GEPA components: the contract and the always-on tips (one per line)."""
    out: dict[str, str] = {}
    if (contract := version.layer_text("contract")) is not None:
        out["contract"] = contract
    if version.manifest.files.skills is not None:
        out["tips"] = "\n".join(s.tip for s in parse_skills(version.layer_text("skills")) if s.trigger.strip() == "*")
    return out


def apply_components(seed: HarnessVersion, candidate: dict[str, str], train_tasks: list[Task]) -> HarnessVersion:
    """The seed with the candidate's text layers, through the static checks (raises CheckFailed). Triggered
    (retrieved) skills of the seed are kept; the candidate's tips become always-on skills."""
    if candidate == text_components(seed):
        return seed
    files = dict(seed.files)
    layers = seed.manifest.files
    if "contract" in candidate and layers.contract is not None:
        files[layers.contract] = candidate["contract"].strip() + "\n"
    if "tips" in candidate and layers.skills is not None:
        kept = [{"id": s.id, "trigger": s.trigger, "tip": s.tip}
                for s in parse_skills(seed.layer_text("skills")) if s.trigger.strip() != "*"]
        lines = [re.sub(r"^\s*(?:[-*\u2022]|\d+[.)])\s*", "", line).strip() for line in candidate["tips"].splitlines()]
        tips = [{"id": f"gepa-{i + 1}", "trigger": "*", "tip": t} for i, t in enumerate(x for x in lines if x)]
        files[layers.skills] = json.dumps(kept + tips[:MAX_TIPS], indent=1) + "\n"
    return check_static(seed, files, train_tasks)


# ---- the sync/async bridge -------------------------------------------------------------------------------

class LoopBridge:
    """Runs coroutines on the event loop from GEPA's worker thread and waits for them."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.closed = threading.Event()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self.closed.is_set():
            coro.close()
            raise GepaStopped("the compare/train task ended")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        while True:
            try:
                return future.result(timeout=0.5)
            except concurrent.futures.TimeoutError:
                if self.closed.is_set():
                    future.cancel()
                    raise GepaStopped("the compare/train task ended") from None

    def call(self, fn: Callable[[], T]) -> T:
        async def wrapped() -> T:
            return fn()

        return self.run(wrapped())


async def in_thread(fn: Callable[[], T], bridge: LoopBridge) -> T:
    """`fn()` in a daemon thread while this loop keeps serving its calls; cancelling stops it at its next call."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(value: Any, error: BaseException | None) -> None:
        if not done.done():
            done.set_exception(error) if error is not None else done.set_result(value)

    def target() -> None:
        try:
            value = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
            loop.call_soon_threadsafe(settle, None, exc)
        else:
            loop.call_soon_threadsafe(settle, value, None)

    threading.Thread(target=target, name="gepa-optimize", daemon=True).start()
    try:
        return await done
    finally:
        bridge.closed.set()


# ---- adapter, reflection model, stoppers, curve ----------------------------------------------------------

def feedback(traj: Trajectory, task: Task, with_gold: bool) -> str:
    """What the reflection LM reads about one episode: the grade and the objective failure facts."""
    if traj.passed:
        return f"Correct (score {traj.score:.2f})."
    rec = failure_record(traj, task.gold)
    f = rec.facts
    parts = [f"Incorrect (score {traj.score:.2f}); the episode ended as '{traj.termination}'."]
    if with_gold:
        parts.append(f"Expected answer: {rec.expected}. Answer extracted by the harness: {traj.final_answer!r}.")
        if f.expected_in_reply:
            parts.append(f"The expected answer is in the reply (wrapped as {f.expected_wrapper}) but was not "
                         "given as the final answer in the required format.")
    if traj.score_detail:
        parts.append(f"Grader: {traj.score_detail[:300]}")
    if f.truncated:
        parts.append("The reply was cut off at the token limit.")
    if rec.rules:
        parts.append(f"Rejected by the harness rule(s): {', '.join(sorted(set(rec.rules)))}.")
    parts += [f"Tool-call problem: {kind} x{n}." for kind, n in f.tool_failures().items()]
    if f.crash:
        parts.append(f"Crash: {f.crash}")
    return " ".join(parts)


@dataclass
class RunnerAdapter:
    """GEPA's adapter over our runner. `evaluate` is called from GEPA's thread; its work runs on the loop."""

    bridge: LoopBridge
    runner: Runner
    seed: HarnessVersion
    train_tasks: list[Task]
    val_ids: set[str]
    trials: int
    fresh: int = 0  # episodes actually run by this process (cache-served ones are `cached`)
    cached: int = 0
    rejected: int = 0  # candidates refused by the static checks (never run)
    versions: dict[str, str] = field(default_factory=dict)  # candidate json -> harness id
    parent_id: str | None = None  # the harness GEPA is mutating this iteration (lineage of its children)
    propose_new_texts: Any = None
    stop: Callable[[], bool] | None = None  # asked before each episode starts (a spent time budget)

    def build(self, candidate: dict[str, str]) -> HarnessVersion:
        version = apply_components(self.seed, candidate, self.train_tasks)
        self.versions[json.dumps(candidate, sort_keys=True)] = version.id
        return version

    def harness_id(self, candidate: dict[str, str]) -> str:
        key = json.dumps(candidate, sort_keys=True)
        return self.versions.get(key) or self.build(candidate).id

    def evaluate(self, batch: list[Task], candidate: dict[str, str], capture_traces: bool = False) -> Any:
        return self.bridge.run(self._evaluate(batch, candidate, capture_traces))

    async def _evaluate(self, batch: list[Task], candidate: dict[str, str], capture: bool) -> Any:
        from gepa.core.adapter import EvaluationBatch

        try:
            version = self.build(candidate)
        except CheckFailed as exc:
            self.rejected += 1
            note = f"The candidate was refused by the checks and not run: {exc}"
            traces = [{"prompt": t.prompt[:TEXT], "reply": "", "score": 0.0, "feedback": note} for t in batch]
            return EvaluationBatch(outputs=[{"task_id": t.id, "refused": str(exc)} for t in batch],
                                   scores=[0.0] * len(batch), trajectories=traces if capture else None,
                                   num_metric_calls=0)
        if version.id != self.seed.id:  # before the runner stores it without lineage
            self.runner.store.save_version(version, parent=self.parent_id, note=f"{ARM} candidate")
        label = "val" if batch and all(t.id in self.val_ids for t in batch) else "train"
        unique = list({t.id: t for t in batch}.values())
        eval_id = self.runner.eval_id(version, unique, self.trials, label)
        before = self.runner.store.done_keys(eval_id)
        await self.runner.evaluate(version, unique, self.trials, label, label, stop=self.stop)
        by_task: dict[str, list[Trajectory]] = {}
        fresh = 0
        for t in self.runner.store.trajectories(eval_id):
            if t.termination == INFRA_ERROR:
                continue
            by_task.setdefault(t.task_id, []).append(t)
            if (t.task_id, t.trial) not in before:
                fresh += not cached(t)
                self.cached += cached(t)
        self.fresh += fresh
        outputs, scores, traces = [], [], []
        for task in batch:
            runs = by_task.get(task.id, [])
            score = sum(t.score for t in runs) / len(runs) if runs else 0.0
            shown = next((t for t in runs if not t.passed), runs[0] if runs else None)
            outputs.append({"task_id": task.id, "answer": shown.final_answer if shown else None, "score": score})
            scores.append(score)
            traces.append({"prompt": task.prompt[:TEXT], "score": score,
                           "reply": "\n---\n".join(r[-TEXT:] for r in shown.replies()[-2:]) if shown else "",
                           "feedback": feedback(shown, task, label == "train") if shown else
                           "The episode was lost by the infrastructure (not scored)."})
        return EvaluationBatch(outputs=outputs, scores=scores, trajectories=traces if capture else None,
                               num_metric_calls=fresh)

    def make_reflective_dataset(self, candidate: dict[str, str], eval_batch: Any,
                                components_to_update: list[str]) -> dict[str, list[dict[str, Any]]]:
        traces = [t for t in eval_batch.trajectories or [] if t]
        ordered = [t for t in traces if t["score"] < 1.0] + [t for t in traces if t["score"] >= 1.0]
        items = [{"Inputs": {"task": t["prompt"]}, "Generated Outputs": t["reply"] or "(no reply)",
                  "Feedback": t["feedback"]} for t in ordered[:MAX_EXAMPLES]]
        return {name: items for name in components_to_update}


@dataclass
class ReflectionModel:
    """GEPA's `LanguageModel` (prompt -> text) over our metered role model, called on the loop."""

    bridge: LoopBridge
    model: MeteredModel
    params: GenerationParams
    tokens: int = 0  # fresh (non-cache-hit) tokens of this process's calls

    def __call__(self, prompt: str | list[dict[str, Any]]) -> str:
        messages = ([Message(role="user", content=prompt)] if isinstance(prompt, str)
                    else [Message(role=m["role"], content=str(m["content"])) for m in prompt])
        response = self.bridge.run(self.model.chat(ChatRequest(messages=messages, params=self.params)))
        if not response.cache_hit:
            self.tokens += response.usage.total_tokens
        return response.text
