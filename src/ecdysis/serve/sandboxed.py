"""The harness's own code (H2 `action.py`, H4 `regulate.py`) run sandboxed: one worker per conversation.

Harness code is written by a model: the proxy, which holds the upstream's keys, does not import it, and no
state of it passes from one conversation to another. Each conversation gets a worker process of its own
(`children.py`): forked from a template that has imported the library but run no harness code, in namespaces
of its own (private /sandbox, /tmp and /dev/shm; its own PID, network and IPC namespaces), under rlimits,
the audit hook and the template's pids cgroup. It loads the harness code itself, so whatever the code keeps
in module globals, files or processes stays with that conversation and dies with its worker.

A conversation is recognised by content, never by a name a client chooses: the client resends the whole
history with every request, so at the end of a turn the worker is parked under the digest of that request's
messages followed by the reply the client got (`Lineage`), and a later request whose messages start with
exactly those is served by it. Anything else gets a fresh worker. Two conversations that are identical so far
(same messages, same reply) cannot be told apart, so neither keeps a worker. Idle workers are parked for
`IDLE_S` (at most `max_parked`, least recently used ended first; none that grew by more than `PARKED_MB`);
fresh ones are kept loaded ahead (`spares`).

Every request carries a random id. The reply must be one valid message with that id, of the request's kind,
within `CALL_TIMEOUT_S`; anything else (a malformed, extra or oversize line, another id, no answer, a worker
that died, a line written while parked) fails that request with LayerCodeError (HTTP 500) and kills the
worker; the conversation's next request gets a fresh one. A fork bomb spends the pids cgroup's budget (else
RLIMIT_NPROC): its fork fails, and so its request. The budget is shared by all workers, so a call after
which harness code keeps more than `EXTRA_TASKS` processes or threads fails too and its worker is ended:
no conversation can hold the budget beyond one call.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Coroutine, Sequence
from typing import Any

from pydantic import BaseModel

from ..sandbox.confine import TASK_MARGIN
from ..sandbox.framing import ProtocolError, encode, read_message
from .children import Child, Children, LayerCodeError, probe, violation
from .messages import Failed, LayerReply, Realized, RealizeRequest, RegulateRequest, Verdicts

__all__ = ["CALL_TIMEOUT_S", "LayerCodeError", "Lineage", "SandboxedLayers", "probe", "request_id"]
CALL_TIMEOUT_S = 10.0  # one request's harness code
IDLE_S = 300.0  # a conversation's worker is ended after this long without a request
MAX_PARKED = 32  # idle conversation workers kept
PROCESS_SPARES = 2  # fresh workers kept ahead when each is a process of its own (~0.3 s of CPU to start)
EXTRA_TASKS = 8  # processes and threads harness code may leave running after a call (the budget is shared)
PARKED_MB = 256  # memory a worker may have added since it loaded and still be kept between turns


def request_id() -> str:
    """A fresh id no harness code can guess ahead."""
    return os.urandom(12).hex()


class Lineage:
    """Where a request stands in its conversation, by content: a digest of each prefix of its messages
    (computed on first use: a request that runs no harness code does not pay for it)."""

    def __init__(self, messages: Sequence[BaseModel]) -> None:
        self._messages = messages
        self._prefixes: list[str] | None = None
        self._digest = hashlib.sha256()
        self.child: Child | None = None  # the worker serving this request, once bound

    @classmethod
    def of(cls, messages: Sequence[BaseModel]) -> Lineage:
        return cls(messages)

    @property
    def prefixes(self) -> list[str]:
        if self._prefixes is None:
            self._prefixes = []
            for message in self._messages:
                self._digest.update(message.model_dump_json().encode() + b"\n")
                self._prefixes.append(self._digest.copy().hexdigest())
        return self._prefixes

    def after(self, reply: BaseModel) -> str:
        """The digest of this request's messages followed by `reply` (what the client will send back next)."""
        self.prefixes  # noqa: B018 - fills the running digest
        digest = self._digest.copy()
        digest.update(reply.model_dump_json().encode() + b"\n")
        return digest.hexdigest()


class SandboxedLayers:
    """Host side: a sandboxed worker per conversation; `spares` fresh ones loaded ahead, `max_parked` idle ones
    kept. `concurrency`: requests served at once (with the parked and spare workers, it sizes the process
    budget). Calls run in one event loop (the serving loop)."""

    def __init__(self, files: dict[str, str], concurrency: int = 16, spares: int = 8,
                 max_parked: int = MAX_PARKED) -> None:
        self.spares, self.max_parked = max(0, spares), max(0, max_parked)
        self.children = Children(files, TASK_MARGIN + 3 * (max(1, concurrency) + self.spares + self.max_parked) + 8)
        self.isolation = ""
        self._spare: list[Child] = []  # fresh, loaded, oldest first
        self._parked: dict[str, Child] = {}  # by what their conversation's next request starts with; oldest first
        self._ambiguous: dict[str, float] = {}  # conversation points reached by two conversations (since when)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._preparing = 0
        self._expiry: asyncio.TimerHandle | None = None
        self._closed = False

    def start(self) -> str:
        """Start the template and load the harness code once (blocking); the isolation workers get."""
        self.isolation = self.children.start(ahead=self.spares)
        return self.isolation

    def _background(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # workers -------------------------------------------------------------------------------------------
    async def _fresh(self) -> Child:
        while self._spare:
            child = self._spare.pop(0)  # the oldest: longest settled (see zygote._settle)
            if child.alive():
                return child
            await child.release()
        return await self.children.prepare()

    async def _add_spare(self) -> None:
        try:
            child = await self.children.prepare()
        except (LayerCodeError, OSError):
            return  # the request that needs one prepares its own and reports why it failed
        finally:
            self._preparing -= 1
        if self._closed:
            await child.release()
        else:
            self._spare.append(child)

    def _refill(self) -> None:
        """Prepare fresh workers ahead, up to `spares` (after a reply: a worker's start-up then does not compete
        with the request it would serve); at most `PROCESS_SPARES` where each is a process of its own."""
        wanted = self.spares if self.children.forks else min(self.spares, PROCESS_SPARES)
        for _ in range(wanted - len(self._spare) - self._preparing):
            self._preparing += 1
            self._background(self._add_spare())

    async def _claim(self, lineage: Lineage) -> Child:
        """This conversation's parked worker if there is one, else a fresh one."""
        key = next((d for d in reversed(lineage.prefixes) if d in self._parked), None)
        if key is not None:
            child = self._parked.pop(key)
            if child.watch is not None:  # stopped before the request is read (one reader at a time)
                child.watch.cancel()
                await asyncio.wait([child.watch])
            if child.alive():
                return child
            await child.release()
        return await self._fresh()

    async def bind(self, lineage: Lineage) -> Child:
        """The worker serving this request (its conversation's, else a fresh one), kept until `end_turn`."""
        if lineage.child is None:
            lineage.child = await self._claim(lineage)
        return lineage.child

    async def end_turn(self, lineage: Lineage, reply: BaseModel | None) -> None:
        """The request is over: park its worker under its messages followed by the `reply` the client got
        (the next request of this conversation starts with exactly those), or end it (no reply: the turn
        failed). Two conversations that are the same so far (same messages, same reply) cannot be told apart:
        neither keeps its worker, and that point of a conversation parks none for `IDLE_S`."""
        child, lineage.child = lineage.child, None
        if child is None:
            return
        if reply is None or self._closed or child.memory_mb() - child.memory_at_load > PARKED_MB:
            await child.release()  # failed, shutting down, or too big to keep idle (parked memory stays bounded)
            return
        key = lineage.after(reply)
        if key in self._parked or key in self._ambiguous:
            self._ambiguous[key] = asyncio.get_running_loop().time()
            other = self._parked.pop(key, None)
            for ended in (child, other):
                if ended is not None:
                    await ended.release()
            return
        self._park(child, key)

    def _park(self, child: Child, key: str) -> None:
        """Keep `child` for its conversation's next request; anything it writes meanwhile ends it."""
        child.last, child.used = key, asyncio.get_running_loop().time()
        self._parked[key] = child
        child.watch = asyncio.get_running_loop().create_task(self._watch(key, child))
        self._end_idle()

    async def _watch(self, key: str, child: Child) -> None:
        try:
            await child.worker.reader.read(1)  # a line written while parked, or the end: broken or gone
        except (ConnectionError, OSError, ValueError):
            pass
        if self._parked.get(key) is child:
            del self._parked[key]
        await child.release()

    def _end_idle(self) -> None:
        """End the least recently used parked workers beyond `max_parked` and those idle for `IDLE_S`."""
        loop = asyncio.get_running_loop()
        for key, since in list(self._ambiguous.items()):
            if loop.time() - since > IDLE_S:
                del self._ambiguous[key]
        excess = len(self._parked) - self.max_parked
        for key, child in list(self._parked.items()):
            if excess <= 0 and loop.time() - child.used < IDLE_S:
                break
            del self._parked[key]
            excess -= 1
            self._background(child.release())
        if self._expiry is not None:
            self._expiry.cancel()
        if self._parked and not self._closed:
            oldest = next(iter(self._parked.values()))
            self._expiry = loop.call_at(oldest.used + IDLE_S + 1, self._end_idle)

    # one request -----------------------------------------------------------------------------------------
    async def call(self, request: RealizeRequest | RegulateRequest, lineage: Lineage | None = None
                   ) -> Realized | Verdicts:
        """The harness code's answer to `request`, from this request's worker (`lineage`: its conversation's,
        kept until `end_turn`; None: a fresh worker ended after this call). LayerCodeError if it fails in any
        way; the worker is then ended."""
        if self._closed:
            raise LayerCodeError("the sandbox is closed")
        child = await self.bind(lineage) if lineage is not None else await self._fresh()
        try:
            reply = await self._exchange(child, request)
            if (left := child.tasks() - child.baseline) > EXTRA_TASKS:
                raise LayerCodeError(f"harness code left {left} processes or threads running after its call (at "
                                     f"most {EXTRA_TASKS}: the sandbox's process budget is shared); its worker was "
                                     "killed")
        except BaseException:
            if lineage is not None:
                lineage.child = None
            await child.release()
            raise
        finally:
            if not self._closed:
                self._refill()
        if lineage is None:
            await child.release()
        return reply

    async def _exchange(self, child: Child, request: RealizeRequest | RegulateRequest) -> Realized | Verdicts:
        try:
            child.worker.writer.write(encode(request))
            await child.worker.writer.drain()
            reply = await asyncio.wait_for(read_message(child.worker.reader, LayerReply), CALL_TIMEOUT_S)
        except ProtocolError as exc:
            raise violation(str(exc)) from None
        except TimeoutError:
            raise LayerCodeError(f"harness code: no answer within {CALL_TIMEOUT_S:g}s; its worker was killed"
                                 ) from None
        except (ConnectionError, OSError) as exc:
            raise LayerCodeError(f"harness code: its sandboxed worker's channel broke ({exc.__class__.__name__})"
                                 ) from None
        if reply is None:
            raise LayerCodeError(await child.died())
        if reply.id != request.id:
            raise violation("a reply to another request")
        if isinstance(reply, Failed):
            raise LayerCodeError(reply.error)
        if isinstance(request, RealizeRequest) != isinstance(reply, Realized):
            raise violation(f"a {reply.op} reply to a {request.op} request")
        if isinstance(reply, Verdicts) and isinstance(request, RegulateRequest) \
                and len(reply.verdicts) != len(request.states):
            raise violation(f"{len(reply.verdicts)} verdicts for {len(request.states)} tool results")
        return reply

    # shutdown ----------------------------------------------------------------------------------------------
    async def aclose(self) -> None:
        """End every worker in the serving loop (their streams close with it running), then the template."""
        self._closed = True
        if self._expiry is not None:
            self._expiry.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        children = [*self._spare, *self._parked.values()]
        self._spare, self._parked = [], {}
        for child in children:
            await child.release()
        self.close()

    def close(self) -> None:
        """Outside the loop too: kill what is left and end the template."""
        self._closed = True
        for child in [*self._spare, *self._parked.values()]:
            child.worker.kill()
        self.children.close()
