"""Host side of the sandbox: take a worker, serve its model and user calls, enforce budgets and the timeout,
and build the episode's record.

The worker's channel is written by a process that runs harness code, so the host reads it only through
`framing.read_message` against the schemas of `protocol` and believes nothing on it but what the agent did
(`ledger`). Any protocol violation (an oversize line, something that is not a message of the protocol, a
call id used twice, a report citing a call the host never served) ends that episode as `crash` with the
reason recorded and the worker killed; the caller's evaluation goes on. A model call over the episode's
budget (derived from its harness: `agent.loop.max_model_calls`) or the run's is refused and ends the
episode `budget`. A worker that crashes, hangs, exceeds a limit or is killed yields a failed trajectory
that keeps the calls the host served and the tail of the worker's stderr; `infra_error` is given only when
the host saw the zygote that forked the episode die.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ..agent.loop import max_model_calls
from ..agent.trajectory import INFRA_ERROR, Trajectory
from ..envs.base import Task
from ..harness.manifest import HarnessVersion
from .confine import TASK_MARGIN, uid_tasks
from .framing import ProtocolError, encode, read_message
from .ledger import MAX_TRACEBACK, BudgetExceeded, EpisodeLedger, Served, UserServed
from .protocol import (
    EPISODE_MESSAGE,
    ChatCall,
    ChatReply,
    DoneReport,
    EpisodeReport,
    EpisodeRequest,
    ExitNote,
    ReplayRequest,
    ReplayResult,
    Started,
    UserCall,
    UserReply,
    WorkerLimits,
)
from .view import SandboxView
from .workers import Worker, WorkerPool, start_worker

ChatHandler = Callable[[list[dict[str, Any]], dict[str, Any]], Awaitable[dict[str, Any]]]
UserHandler = Callable[[list[dict[str, str]]], Awaitable[dict[str, Any]]]
STDERR_TAIL = 8000


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 300.0  # wall clock per task, model time included
    memory_mb: int = 2048  # address space of the worker
    cpu_s: int = 120  # CPU seconds of the worker itself (model time is spent in the host)
    file_mb: int = 64  # largest file the worker may write

    def for_worker(self) -> WorkerLimits:
        """The limits the worker applies to itself, with the task bound for RLIMIT_NPROC taken now."""
        return WorkerLimits(memory_mb=self.memory_mb, cpu_s=self.cpu_s, file_mb=self.file_mb,
                            max_tasks=uid_tasks() + TASK_MARGIN)


class _Ended(Exception):
    """The host ends the episode now with this termination (a budget refusal or a protocol violation)."""

    def __init__(self, termination: str, detail: str) -> None:
        super().__init__(detail)
        self.termination, self.detail = termination, detail


async def _drain(stream: asyncio.StreamReader, sink: bytearray) -> None:
    while chunk := await stream.read(65536):
        sink.extend(chunk)
        if len(sink) > STDERR_TAIL:
            del sink[: len(sink) - STDERR_TAIL]


def _capped(params: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    """The call's parameters with `max_tokens` no larger than the harness's `generation.max_tokens`."""
    requested = params.get("max_tokens")
    if isinstance(requested, int) and not isinstance(requested, bool) and 0 < requested <= max_tokens:
        return params
    return {**params, "max_tokens": max_tokens}


class _Episode:
    """The host's side of one episode's channel."""

    def __init__(self, worker: Worker, ledger: EpisodeLedger, chat: ChatHandler, user: UserHandler | None,
                 max_tokens: int) -> None:
        self.worker, self.ledger, self.chat, self.user, self.max_tokens = worker, ledger, chat, user, max_tokens
        self.measures: list[str] = []
        self.started = False

    async def send(self, message: Any) -> None:
        self.worker.writer.write(encode(message))
        await self.worker.writer.drain()

    async def converse(self, request: EpisodeRequest) -> EpisodeReport | None:
        """Serve the episode until it reports back (its report) or its worker ends (None)."""
        await self.send(request)
        while True:
            try:
                message = await read_message(self.worker.reader, EPISODE_MESSAGE)
            except ProtocolError as exc:
                raise _Ended("crash", f"protocol violation: {exc}") from None
            if message is None:
                return None
            if isinstance(message, DoneReport):
                return message.report
            if isinstance(message, ExitNote):  # a forked worker's end, reported by its parent
                self.worker.exited(message.status)
                return None
            if isinstance(message, Started):
                if self.started or self.ledger.calls:
                    raise _Ended("crash", "protocol violation: `started` sent twice or after a call")
                self.started, self.measures = True, list(message.measures)
                continue
            try:
                self.ledger.claim(message.id)
            except ProtocolError as exc:
                raise _Ended("crash", f"protocol violation: {exc}") from None
            if isinstance(message, ChatCall):
                await self._chat(message)
            else:
                await self._user(message)

    async def _chat(self, call: ChatCall) -> None:
        try:
            self.ledger.admit_model_call()
        except BudgetExceeded as exc:
            raise _Ended("budget", str(exc)) from None
        self.worker.waiting()
        served = Served.model_validate(await self.chat(call.messages, _capped(dict(call.params), self.max_tokens)))
        if served.refused is not None:
            raise _Ended("budget", served.refused)
        self.ledger.model(call.id, call.messages, served)
        await self.send(ChatReply(id=call.id, text=served.text, tool_calls=served.tool_calls,
                                  finish_reason=served.finish_reason, error=served.error))

    async def _user(self, call: UserCall) -> None:
        if self.user is None:
            raise _Ended("crash", "protocol violation: a user turn in an episode without a simulated user")
        conversation = [turn.model_dump() for turn in call.conversation]
        served = UserServed.model_validate(await self.user(conversation))
        self.ledger.user(call.id, conversation, served)
        await self.send(UserReply(id=call.id, text=served.text, stop=served.stop, limit=served.limit,
                                  reason=served.reason, error=served.error))

    def isolation(self) -> str:
        return "+".join(p for p in (self.worker.confined, *self.measures) if p)


async def run_in_sandbox(
    harness: HarnessVersion,
    env_name: str,
    env_options: dict[str, Any],
    task: Task,
    trial: int,
    chat: ChatHandler,
    limits: SandboxLimits,
    user: UserHandler | None = None,
    view: SandboxView | None = None,
    pool: WorkerPool | None = None,
) -> Trajectory:
    """Run one episode in a fresh worker (a new process, or a fork of the pool's zygote). Never raises for
    harness failures or protocol violations.

    `chat` serves a model call: {"text", "tool_calls", "finish_reason", "usage", "latency_s", "cache_hit",
    "retries"}, {"error"} or {"refused": why} (the run's budget is spent: the episode ends `budget`); only the
    reply itself reaches the worker. `user` serves the simulated user's turns (conversation tasks); `view` is
    what the episode sees of the host besides the runtime (the plugin's code and declared files, hidden paths
    masked; its import paths go on the worker's import path); `pool` supplies the worker (forked, or started
    ahead of time).
    """
    view = view or SandboxView()
    start = time.perf_counter()
    stderr = bytearray()
    ledger = EpisodeLedger(task.id, trial, harness.id, max_model_calls(harness.manifest))
    worker = await (pool.take(view, env_name, harness.id) if pool else start_worker(view))
    episode = _Episode(worker, ledger, chat, user, harness.manifest.generation.max_tokens)
    report: EpisodeReport | None = None
    termination, detail = "crash", ""
    try:
        request = EpisodeRequest(files=harness.files, harness_id=harness.id, env=env_name, env_options=env_options,
                                 task=task.public_view(), trial=trial, limits=limits.for_worker(),
                                 has_user=user is not None, plugin_paths=list(view.import_paths),
                                 confined=worker.confined)
        drain = asyncio.create_task(_drain(worker.stderr, stderr))
        try:
            report = await asyncio.wait_for(episode.converse(request), timeout=limits.timeout_s)
            if report is None:
                detail = "the sandbox worker exited without a result"
        except TimeoutError:
            termination, detail = "timeout", f"task exceeded its {limits.timeout_s:g}s time limit"
        except _Ended as ended:
            termination, detail = ended.termination, ended.detail
        except (ConnectionError, BrokenPipeError) as exc:
            detail = f"sandbox channel broke: {exc!r}"
        finally:
            worker.kill()
            await worker.wait()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(drain, timeout=5)
        if report is None and termination == "crash" and not detail.startswith("protocol violation") \
                and worker.lost():  # EOF or a reset while the zygote died: not the harness's doing
            termination, detail = INFRA_ERROR, f"the zygote that forked this episode died ({detail})"
    finally:
        worker.discard()
    result = None
    if report is not None:
        try:
            result = ledger.trajectory(report, episode.isolation())
        except ProtocolError as exc:
            detail = f"protocol violation: {exc}"
    if result is None:
        result = ledger.failed(termination, detail, episode.isolation(), bytes(stderr), worker.returncode)
    result.wall_s = time.perf_counter() - start
    return result


async def replay_in_sandbox(files: dict[str, str], items: list[dict[str, Any]],
                            limits: SandboxLimits) -> dict[str, Any]:
    """Run the candidate's H2 over stored replies in a worker; returns {"results"} (per item, one realized
    record per stored reply) or {"error"} (the candidate's code failed, or its worker broke the protocol)."""
    worker = await start_worker()
    request = ReplayRequest(files=files, items=items, limits=limits.for_worker(), confined=worker.confined)
    stderr = bytearray()
    drain = asyncio.create_task(_drain(worker.stderr, stderr))
    try:
        worker.writer.write(encode(request))
        await worker.writer.drain()
        message = await asyncio.wait_for(read_message(worker.reader, ReplayResult), timeout=limits.timeout_s)
    except TimeoutError:
        return {"error": f"replay exceeded {limits.timeout_s:g}s"}
    except ProtocolError as exc:
        return {"error": f"replay worker broke the protocol: {exc}"}
    except (ConnectionError, BrokenPipeError) as exc:
        message = None
        stderr.extend(f"\nchannel broke: {exc!r}".encode())
    finally:
        worker.kill()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(drain, timeout=5)
        await worker.aclose()
    if message is None:
        return {"error": f"replay worker died: {stderr.decode(errors='replace')[-STDERR_TAIL:]}"}
    if message.error is not None:
        return {"error": message.error[-MAX_TRACEBACK:]}
    results = message.results or []
    expected = [len(item.get("replies") or []) for item in items]
    if [len(r) for r in results] != expected:
        return {"error": f"replay worker broke the protocol: {len(results)} result(s) for {len(items)} item(s), "
                         "or a result's length differs from its item's replies"}
    return {"results": [[reply.record() for reply in result] for result in results]}
