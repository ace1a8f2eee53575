"""Recording served traffic in a run store: every request is a turn of a conversation.

A `serve` process opens one run (kind `serve`) and one evaluation (label `serve`, split `traffic`)
in its store directory. Each conversation is a trajectory of that evaluation (task id = the
conversation id) whose events have the shapes Ecdysis's own loop writes (`prompt`, `model`,
`repair`, `rejection`, `action`, `tool_error`, `observation`, `annotation`, `stop`), so failure
aggregation and H2 replay read it like any collect. Each turn is also a `serve_turn` record
(tokens, latency, the proxy's own overhead, repairs). An outcome (score, pass/fail) attached to a
conversation becomes the trajectory's score.

Writes happen on one background thread, in order and in batches, off the request path; `flush` waits
for them (a killed process loses at most the last batch, `batch_s`).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import queue
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from ..agent.trajectory import Trajectory
from ..harness.manifest import HarnessVersion
from ..models.base import Message
from ..store.db import RunStore, claim_run_dir

log = logging.getLogger("ecdysis.serve")
SERVE_KIND, SERVE_LABEL, SERVE_SPLIT = "serve", "serve", "traffic"
TURN_KIND, OUTCOME_KIND = "serve_turn", "serve_outcome"
MAX_LIVE_CONVERSATIONS = 10_000


class TurnRecord(BaseModel):
    """One request/response of a conversation, as stored (`records` kind `serve_turn`)."""

    conversation: str
    index: int
    started: float
    latency_s: float  # the whole request, as the proxy saw it
    upstream_s: float  # time spent waiting for the upstream model
    overhead_ms: float  # latency minus upstream time: what the proxy itself cost
    attempts: int = 0  # upstream calls (1 + retries after a rejection)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    repairs: list[str] = Field(default_factory=list)
    rejections: list[str] = Field(default_factory=list)  # H2 rules (or invalid_arguments, unknown_tool) retried
    gave_up: bool = False  # retries exhausted: the agent got the last reply as it was
    stopped: str = ""  # H4 stop reason (the upstream was not called)
    annotations: int = 0
    tool_calls: int = 0
    stream: bool = False
    status: int = 200
    error: str = ""


class ConversationOutcome(BaseModel):
    """A score attached to a conversation (`POST /v1/conversations/{id}/outcome` or the outcome header)."""

    score: float | None = None
    passed: bool | None = None
    note: str = ""

    def resolved(self, threshold: float = 1.0) -> tuple[float, bool]:
        """(score, passed): a missing score follows pass/fail; a missing pass/fail is score >= threshold."""
        if self.score is None and self.passed is None:
            raise ValueError("an outcome needs a score or passed")
        score = self.score if self.score is not None else float(bool(self.passed))
        passed = self.passed if self.passed is not None else score >= threshold
        return score, passed


def parse_outcome_header(value: str) -> ConversationOutcome:
    """`pass` / `fail` / `true` / `false` / a number (score; passed when >= 1)."""
    text = value.strip().lower()
    if text in ("pass", "passed", "true", "ok", "success"):
        return ConversationOutcome(passed=True)
    if text in ("fail", "failed", "false", "failure"):
        return ConversationOutcome(passed=False)
    try:
        return ConversationOutcome(score=float(text))
    except ValueError:
        raise ValueError(f"outcome header {value!r}: use pass, fail or a number") from None


def derived_conversation_id(messages: list[Message]) -> str:
    """A conversation's id from its prefix: the system messages and the first user message (stable over its
    turns; two conversations opening identically share it: send `X-Ecdysis-Conversation` to tell them apart)."""
    head: list[str] = []
    for m in messages:
        head.append(f"{m.role}\0{m.content}")
        if m.role == "user":
            break
    return "c-" + hashlib.sha256("\0\0".join(head).encode()).hexdigest()[:16]


class _Live:
    """Request-path state of a conversation: how many upstream replies and turns it has had."""

    __slots__ = ("model_calls", "turns", "lock")

    def __init__(self) -> None:
        self.model_calls = 0
        self.turns = 0
        self.lock = asyncio.Lock()


class TraceRecorder:
    """The serve run in `store_dir`. Request-path methods only queue; one writer thread applies the queue in
    batches (every `batch_s`), writing each changed conversation once per batch."""

    def __init__(self, store_dir: Path | str, harness: HarnessVersion, upstream: str, config: dict[str, Any],
                 batch_s: float = 0.25) -> None:
        self.store_dir = Path(store_dir)
        self.store = RunStore(self.store_dir)
        claim_run_dir(self.store_dir)
        self.run_id = self.store.start_run(SERVE_KIND, {"upstream": upstream, "harness": harness.id, **config})
        self.store.save_version(harness, note="served")
        self.eval_id = f"{self.run_id}-traffic"
        self.store.open_evaluation(self.eval_id, self.run_id, harness.id, upstream, SERVE_KIND, SERVE_SPLIT, 1, 0,
                                   SERVE_LABEL)
        self.harness_id = harness.id
        self.batch_s = batch_s
        self.turns = 0
        self._live: OrderedDict[str, _Live] = OrderedDict()
        self._trajectories: OrderedDict[str, Trajectory] = OrderedDict()  # writer thread only
        self._evicted = False
        self._queue: queue.SimpleQueue[tuple[Any, tuple[Any, ...], Future[Any] | None] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="ecdysis-serve-store", daemon=True)
        self._thread.start()

    # request path -------------------------------------------------------------------------------
    def live(self, conversation: str) -> _Live:
        state = self._live.get(conversation)
        if state is None:
            state = self._live[conversation] = _Live()
            while len(self._live) > MAX_LIVE_CONVERSATIONS:
                self._live.popitem(last=False)
        else:
            self._live.move_to_end(conversation)
        return state

    def submit(self, conversation: str, events: list[dict[str, Any]], turn: TurnRecord, final: dict[str, Any],
               messages: list[Message]) -> None:
        """Queue one finished turn for storage. `events` and `messages` must not be mutated afterwards."""
        self.turns += 1
        self._queue.put((self._apply_turn, (conversation, events, turn, final, messages), None))

    def _call(self, fn: Any, *args: Any) -> asyncio.Future[Any]:
        future: Future[Any] = Future()
        self._queue.put((fn, args, future))
        return asyncio.wrap_future(future)

    def attach_outcome(self, conversation: str, outcome: ConversationOutcome) -> asyncio.Future[bool]:
        """Queue an outcome; the future (resolved once stored) says whether the conversation was found."""
        return self._call(self._apply_outcome, conversation, outcome)

    async def flush(self) -> None:
        """Wait until everything queued so far is stored."""
        await self._call(lambda dirty: None)

    def close(self, status: str = "finished") -> None:
        """Store what is queued, then close the run."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        self.store.finish_run(self.run_id, {"turns": self.turns, "conversations": len(self._trajectories)}, status)
        self.store.close()

    # writer thread ------------------------------------------------------------------------------
    def _run(self) -> None:
        done = False
        while not done:
            batch = [self._queue.get()]
            time.sleep(self.batch_s)  # let the batch fill: a busy conversation is written once per batch
            while True:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            dirty: set[str] = set()
            results: list[tuple[Future[Any], Any, BaseException | None]] = []
            for item in batch:
                if item is None:
                    done = True
                    continue
                fn, args, future = item
                try:
                    value, error = fn(*args, dirty), None
                except Exception as exc:  # noqa: BLE001 - storage must never take the proxy down; it is logged
                    log.exception("recording failed")
                    value, error = None, exc
                if future is not None:
                    results.append((future, value, error))
            for conversation in dirty:
                try:
                    self.store.record_trajectory(self.eval_id, self._trajectories[conversation])
                except Exception:  # noqa: BLE001
                    log.exception("recording conversation %s failed", conversation)
            for future, value, error in results:
                if error is not None:
                    future.set_exception(error)
                else:
                    future.set_result(value)

    def _trajectory(self, conversation: str) -> Trajectory:
        traj = self._trajectories.get(conversation)
        if traj is None:
            found = find_conversation(self.store, conversation, self.eval_id) if self._evicted else None
            traj = found[1] if found else Trajectory(conversation, 0, self.harness_id, termination="answered")
            self._trajectories[conversation] = traj
            while len(self._trajectories) > MAX_LIVE_CONVERSATIONS:  # stored already: read back if it returns
                self._trajectories.popitem(last=False)
                self._evicted = True
        else:
            self._trajectories.move_to_end(conversation)
        return traj

    def _apply_turn(self, conversation: str, events: list[dict[str, Any]], turn: TurnRecord,
                    final: dict[str, Any], messages: list[Message], dirty: set[str]) -> None:
        traj = self._trajectory(conversation)
        for event in events:
            if event["kind"] == "prompt" and traj.of_kind("prompt"):
                traj.of_kind("prompt")[0].update(tools=event["tools"])  # the latest tools are replayed
                continue
            traj.events.append(event)
        traj.model_calls += turn.attempts
        traj.prompt_tokens += turn.prompt_tokens
        traj.completion_tokens += turn.completion_tokens
        traj.model_time_s += turn.upstream_s
        traj.wall_s += turn.latency_s
        traj.termination = ("model_error" if turn.status == 502 else "stopped" if turn.stopped
                            else "rejected" if turn.gave_up else "answered")
        if final.get("content") and not final.get("tool_calls"):
            traj.final_answer = final["content"]
        traj.conversation = [m.to_openai() for m in messages if m.role != "system"] + ([final] if final else [])
        self.store.put_record(self.run_id, TURN_KIND, f"{conversation}/{turn.index:05d}", turn.model_dump())
        dirty.add(conversation)

    def _apply_outcome(self, conversation: str, outcome: ConversationOutcome, dirty: set[str]) -> bool:
        score, passed = outcome.resolved()
        if conversation in self._trajectories or (self._evicted and find_conversation(
                self.store, conversation, self.eval_id)):
            traj = self._trajectory(conversation)
            traj.score, traj.passed = score, passed
            traj.score_detail = outcome.note or "outcome attached by the client"
            dirty.add(conversation)
        else:  # a conversation of an earlier serve run in this store
            found = find_conversation(self.store, conversation)
            if found is None:
                return False
            eval_id, traj = found
            traj.score, traj.passed = score, passed
            traj.score_detail = outcome.note or "outcome attached by the client"
            self.store.record_trajectory(eval_id, traj)
        self.store.put_record(self.run_id, OUTCOME_KIND, conversation,
                              {"score": score, "passed": passed, "note": outcome.note, "at": time.time()})
        return True


def serve_evaluations(store: RunStore) -> list[dict[str, Any]]:
    """Every serve evaluation in the store, oldest first."""
    out = []
    for run in store.runs():
        if run["kind"] == SERVE_KIND:
            out += [e for e in store.evaluations(run["id"]) if e["label"] == SERVE_LABEL]
    return out


def find_conversation(store: RunStore, conversation: str, eval_id: str | None = None
                      ) -> tuple[str, Trajectory] | None:
    """The newest recorded trajectory of `conversation` (in `eval_id` only, if given) and its evaluation id."""
    for evaluation in reversed(serve_evaluations(store)):
        if eval_id is not None and evaluation["id"] != eval_id:
            continue
        for traj in store.trajectories(evaluation["id"]):
            if traj.task_id == conversation:
                return evaluation["id"], traj
    return None


def scored_conversations(store: RunStore) -> list[Trajectory]:
    """The newest recorded trajectory of every conversation that received an outcome."""
    scored: set[str] = set()
    for run in store.runs():
        if run["kind"] == SERVE_KIND:
            scored |= {key for key, _ in store.records(run["id"], OUTCOME_KIND)}
    newest: dict[str, Trajectory] = {}
    for evaluation in serve_evaluations(store):
        for traj in store.trajectories(evaluation["id"]):
            if traj.task_id in scored:
                newest[traj.task_id] = traj
    return list(newest.values())
