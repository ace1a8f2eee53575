"""The harness's own code (H2 `action.py`, H4 `regulate.py`) run sandboxed, in a fresh child process per request.

Harness code is written by a model: the proxy, which holds the upstream's keys, does not import it, and no
state of it outlives the request it ran for, so none passes from one conversation to another. A template
process (`serve/zygote.py`) runs under bubblewrap, in a pids cgroup, with the library imported but no harness
code run; it forks one child per request. The child enters namespaces of its own (private /sandbox, /tmp and
/dev/shm, its own PID, network and IPC namespaces), applies rlimits and the audit hook, loads the harness
code, answers exactly one request (`serve/messages.py`, framed by `sandbox/framing.py`) and is killed. A few
children are forked and loaded ahead (`spares`), so a request rarely waits for one. Where nested namespaces
are unavailable, each request gets a fresh confined process instead (also started ahead; slower under load).

Every request carries a random id. The reply must be one valid message with that id, of the request's kind,
within `CALL_TIMEOUT_S`; anything else (an extra or malformed line, another id, a line over
`framing.MAX_LINE`, no answer, a child that died) fails that request with LayerCodeError (HTTP 500) and
kills its child; the next request has a fresh child anyway. Processes are bounded by the template's pids
cgroup (else RLIMIT_NPROC): a fork bomb fails its fork, and so its request.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from ..sandbox.confine import TASK_MARGIN, bwrap_path, confine_argv, pids_cgroup, pids_cgroup_root, uid_tasks
from ..sandbox.forkserver import STREAM_LIMIT, Forked, ForkServer, ZygoteError
from ..sandbox.framing import MAX_LINE, ProtocolError, decode, encode, read_message
from ..sandbox.view import SandboxView
from ..sandbox.workers import SRC_ROOT, ProcessWorker, Worker, worker_env
from .messages import (
    Failed,
    LayerReply,
    LoadFailed,
    Ready,
    Realized,
    RealizeRequest,
    RegulateRequest,
    StartMessage,
    Verdicts,
)

CALL_TIMEOUT_S = 10.0  # one request's harness code
LOAD_TIMEOUT_S = 60.0  # a child loading the harness code (imports included)
LIMITS = {"memory_mb": 2048, "cpu_s": 60, "file_mb": 16}  # per child, i.e. per request
STDERR_TAIL = 2000
ZYGOTE = "ecdysis.serve.zygote"


class LayerCodeError(RuntimeError):
    """The sandboxed harness code failed, broke the protocol, timed out or its child died (the message says
    which). Only the request it ran for fails."""


def request_id() -> str:
    """A fresh id no harness code can guess ahead."""
    return os.urandom(12).hex()


def _violation(what: str) -> LayerCodeError:
    return LayerCodeError(f"harness code broke the sandbox protocol ({what}); this request failed and its "
                          "worker was killed (the next request gets a fresh one)")


def _limits(tasks: int, cgroup: bool) -> dict[str, Any]:
    """The child's rlimits; with no pids cgroup, RLIMIT_NPROC bounds its processes (the user's, counted now)."""
    return {**LIMITS, **({} if cgroup else {"max_tasks": uid_tasks() + tasks})}


def _read_start(sock: socket.socket, timeout_s: float) -> Ready | LoadFailed:
    """A child's first message, read from a blocking socket (start-up, outside the event loop)."""
    sock.settimeout(timeout_s)
    data = bytearray()
    try:
        while b"\n" not in data and len(data) <= MAX_LINE:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data.extend(chunk)
    except TimeoutError:
        raise LayerCodeError(f"the sandboxed harness code did not load within {timeout_s:g}s") from None
    if not data:
        raise LayerCodeError("the sandboxed worker exited before loading the harness code")
    try:
        return decode(bytes(data.split(b"\n", 1)[0]), StartMessage)
    except ProtocolError as exc:
        raise _violation(str(exc)) from None


async def _drain(stream: asyncio.StreamReader, tail: bytearray) -> None:
    with contextlib.suppress(Exception):
        while chunk := await stream.read(65536):
            tail.extend(chunk)
            del tail[: max(0, len(tail) - STDERR_TAIL)]


class SandboxedLayers:
    """Host side: a fresh sandboxed child per `call`, forked from the template (or a fresh process where
    nested namespaces are unavailable), `spares` of them kept loaded ahead of need (in the serving loop).
    `concurrency`: requests served at once, which sizes the process budget."""

    def __init__(self, files: dict[str, str], concurrency: int = 16, spares: int = 2) -> None:
        self.files = files
        self.spares = max(0, spares)
        self.max_tasks = TASK_MARGIN + 3 * (max(1, concurrency) + self.spares) + 8
        self.isolation = ""
        self._dir = ""
        self._root = ""
        self._server: ForkServer | None = None
        self._lock = threading.Lock()
        self._threads = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="serve-fork")
        self._ready: list[_Child] = []  # loaded children waiting for a request
        self._preparing: set[asyncio.Task[None]] = set()
        self._closed = False

    # start-up --------------------------------------------------------------------------------------
    def start(self) -> str:
        """Copy the harness, start the template and load the harness code once in a child (blocking). Returns
        the isolation the children get; LayerCodeError with the harness code's error if it does not load."""
        from ..harness.manifest import version_from_files

        self._dir = tempfile.mkdtemp(prefix="ecdysis-serve-")
        self._root = str(version_from_files(self.files, origin="harness").write(Path(self._dir) / "harness"))
        self._server = self._start_server()
        if self._server is None:
            start = self._probe_process()
        else:
            forked = self._fork()
            try:
                start = _read_start(forked.channel, LOAD_TIMEOUT_S)
            finally:
                forked.close()
        if isinstance(start, LoadFailed):
            raise LayerCodeError(start.error)
        cgroup = self._server is not None and self._server.cgroup is not None
        self.isolation = start.isolation + ("+pids-cgroup" if cgroup else "")
        return self.isolation

    def _start_server(self) -> ForkServer | None:
        limits = _limits(self.max_tasks, pids_cgroup_root() is not None)
        return ForkServer.start(SRC_ROOT, worker_env("/sandbox"), SandboxView(read_only=(self._root,)),
                                max_tasks=self.max_tasks, module=ZYGOTE, args=(self._root, json.dumps(limits)))

    def _process_command(self) -> tuple[list[str], dict[str, str], str, Any, str]:
        """(argv, env, workdir, cgroup, measures) of a fresh child process (the fallback)."""
        workdir = tempfile.mkdtemp(prefix="ecdysis-serve-sbx-")
        cgroup = pids_cgroup(TASK_MARGIN)
        measures = "+".join(m for m, on in (("bwrap", bwrap_path()), ("pids-cgroup", cgroup)) if on)
        command = [sys.executable, "-m", ZYGOTE, "--once", self._root,
                   json.dumps(_limits(TASK_MARGIN, cgroup is not None)), measures]
        env = worker_env(workdir)
        confined = confine_argv(command, env, SRC_ROOT, [self._root], [])
        return (confined or command), (env if confined is None else {}), workdir, cgroup, measures

    def _probe_process(self) -> Ready | LoadFailed:
        argv, env, workdir, cgroup, _ = self._process_command()
        try:
            done = subprocess.run(argv, input=b"", capture_output=True, timeout=LOAD_TIMEOUT_S, cwd=workdir,
                                  env=env or None, check=False, preexec_fn=cgroup.enter if cgroup else None)
        except subprocess.TimeoutExpired:
            raise LayerCodeError(f"the sandboxed harness code did not load within {LOAD_TIMEOUT_S:g}s") from None
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
            if cgroup is not None:
                cgroup.release()
        first = done.stdout.split(b"\n", 1)[0]
        if not first:
            raise LayerCodeError(done.stderr.decode(errors="replace")[-STDERR_TAIL:].strip()
                                 or f"the sandboxed worker exited with status {done.returncode}")
        try:
            return decode(first, StartMessage)
        except ProtocolError as exc:
            raise _violation(str(exc)) from None

    # children ----------------------------------------------------------------------------------------
    def _fork(self) -> Forked:
        """A child forked from the template (blocking, a few ms); a new template if the old one died."""
        server = self._server
        assert server is not None
        try:
            return server.fork()
        except ZygoteError as exc:
            if server.alive():  # the process budget is spent: a fork bomb in a request running now
                raise LayerCodeError(f"no sandboxed worker could be forked for this request ({exc})") from None
        with self._lock:
            if self._server is server and not self._closed:
                server.close()
                self._server = self._start_server()
        if self._server is None:
            raise LayerCodeError("the sandbox's template process died and could not be restarted")
        try:
            return self._server.fork()
        except ZygoteError as exc:
            raise LayerCodeError(f"no sandboxed worker could be forked for this request ({exc})") from None

    async def _start_process(self) -> ProcessWorker:
        argv, env, workdir, cgroup, measures = self._process_command()
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            cwd=workdir, env=env or None, start_new_session=True, limit=STREAM_LIMIT,
            preexec_fn=cgroup.enter if cgroup else None)
        return ProcessWorker(proc, measures, workdir, asyncio.get_running_loop(), cgroup)

    async def _prepare(self) -> _Child:
        """A child of its own that has loaded the harness code and waits for its request."""
        if self._server is not None:
            forked = await asyncio.wrap_future(self._threads.submit(self._fork))
            assert self._server is not None
            worker: Worker = await forked.open(self._server)
        else:
            worker = await self._start_process()
        child = _Child(worker)
        try:
            start = await asyncio.wait_for(read_message(worker.reader, StartMessage), LOAD_TIMEOUT_S)
        except ProtocolError as exc:
            await child.release()
            raise _violation(str(exc)) from None
        except (TimeoutError, OSError) as exc:
            await child.release()
            raise LayerCodeError(f"the sandboxed harness code did not load ({exc.__class__.__name__})") from None
        if not isinstance(start, Ready):
            await child.release()
            raise LayerCodeError(start.error if start is not None else await child.died())
        return child

    async def _spare(self) -> None:
        try:
            child = await self._prepare()
        except (LayerCodeError, OSError):
            return  # the request that needs one prepares its own and reports why it failed
        if self._closed:
            await child.release()
        else:
            self._ready.append(child)

    def _refill(self) -> None:
        """Prepare children ahead, up to `spares` ready or on their way (after a reply: a child's start-up
        then does not compete with the request it would serve)."""
        for _ in range(self.spares - len(self._ready) - len(self._preparing)):
            task = asyncio.get_running_loop().create_task(self._spare())
            self._preparing.add(task)
            task.add_done_callback(self._preparing.discard)

    async def _take(self) -> _Child:
        while self._ready:
            child = self._ready.pop(0)  # the oldest: longest settled
            if child.alive():
                return child
            await child.release()
        return await self._prepare()

    # one request -------------------------------------------------------------------------------------
    async def call(self, request: RealizeRequest | RegulateRequest) -> Realized | Verdicts:
        """The harness code's answer to `request`, from a fresh child; LayerCodeError if it fails in any way."""
        if self._closed:
            raise LayerCodeError("the sandbox is closed")
        child = await self._take()
        try:
            return await self._exchange(child, request)
        finally:
            await child.release()
            if not self._closed:
                self._refill()

    async def _exchange(self, child: _Child, request: RealizeRequest | RegulateRequest) -> Realized | Verdicts:
        try:
            child.worker.writer.write(encode(request))
            await child.worker.writer.drain()
            reply = await asyncio.wait_for(read_message(child.worker.reader, LayerReply), CALL_TIMEOUT_S)
        except ProtocolError as exc:
            raise _violation(str(exc)) from None
        except TimeoutError:
            raise LayerCodeError(f"harness code: no answer within {CALL_TIMEOUT_S:g}s; its worker was killed"
                                 ) from None
        except (ConnectionError, OSError) as exc:
            raise LayerCodeError(f"harness code: its sandboxed worker's channel broke ({exc.__class__.__name__})"
                                 ) from None
        if reply is None:
            raise LayerCodeError(await child.died())
        if reply.id != request.id:
            raise _violation("a reply to another request")
        if isinstance(reply, Failed):
            raise LayerCodeError(reply.error)
        if isinstance(request, RealizeRequest) != isinstance(reply, Realized):
            raise _violation(f"a {reply.op} reply to a {request.op} request")
        if isinstance(reply, Verdicts) and isinstance(request, RegulateRequest) \
                and len(reply.verdicts) != len(request.states):
            raise _violation(f"{len(reply.verdicts)} verdicts for {len(request.states)} tool results")
        return reply

    # shutdown ----------------------------------------------------------------------------------------
    async def aclose(self) -> None:
        """Stop everything, in the serving loop (children's streams close with it running)."""
        self._closed = True
        for task in list(self._preparing):
            task.cancel()
        await asyncio.gather(*self._preparing, return_exceptions=True)
        ready, self._ready = self._ready, []
        for child in ready:
            await child.release()
        self.close()

    def close(self) -> None:
        """Outside the loop too: kill what is left, end the template, remove the harness copy."""
        self._closed = True
        for child in self._ready:
            child.worker.kill()
        self._threads.shutdown(wait=True)
        with self._lock:
            server, self._server = self._server, None
        if server is not None:
            server.close()
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)


class _Child:
    """One loaded child as the host holds it: its worker, and the tail of its stderr (drained meanwhile)."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.tail = bytearray()
        self._drain = asyncio.get_running_loop().create_task(_drain(worker.stderr, self.tail))

    def alive(self) -> bool:
        pidfd = getattr(self.worker, "pidfd", None)
        if pidfd is not None:  # a pidfd turns readable when its process exits
            return not select.select([pidfd], [], [], 0)[0]
        return self.worker.returncode is None

    async def died(self) -> str:
        """What to say of a child that closed its channel without answering (its last stderr line)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._drain), 0.2)
        last = self.tail.decode(errors="replace").strip().splitlines()[-1:]
        return "harness code: its sandboxed worker died before answering" + (f" ({last[0][:300]})" if last else "")

    async def release(self) -> None:
        """Kill it and free what it held (reaped in the loop if it is a process of its own)."""
        if isinstance(self.worker, ProcessWorker):
            await self.worker.aclose()
        else:
            self.worker.discard()
        self._drain.cancel()
