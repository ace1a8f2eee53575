"""Sandboxed worker processes for `serve`'s harness code: how they are started, and one as the host holds it.

`Children.start` writes a copy of the harness and starts the template (`serve/zygote.py`) through the episode
fork server's machinery (`sandbox/forkserver.py`): bubblewrap, a pids cgroup sized for `max_tasks`, nested
namespaces per worker. It loads the harness code once in a worker to report load errors at start-up.
`Children.prepare` gives a fresh worker that has loaded the harness code and said `Ready`: forked from the
template, or, where nested namespaces are unavailable, a fresh confined process (`--once`).
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
from ..sandbox.framing import MAX_LINE, ProtocolError, decode, read_message
from ..sandbox.view import SandboxView
from ..sandbox.workers import SRC_ROOT, ProcessWorker, Worker, worker_env
from .messages import LoadFailed, Ready, StartMessage

LOAD_TIMEOUT_S = 60.0  # a worker loading the harness code (imports included)
LIMITS = {"memory_mb": 2048, "cpu_s": 600, "file_mb": 16}  # per worker (one conversation's requests)
STDERR_TAIL = 2000
ZYGOTE = "ecdysis.serve.zygote"


class LayerCodeError(RuntimeError):
    """The sandboxed harness code failed, broke the protocol, timed out or its worker died (the message says
    which). Only the request it ran for fails."""


def violation(what: str) -> LayerCodeError:
    return LayerCodeError(f"harness code broke the sandbox protocol ({what}); this request failed and its "
                          "worker was killed (the next request gets a fresh one)")


def _limits(tasks: int, cgroup: bool) -> dict[str, Any]:
    """A worker's rlimits; with no pids cgroup, RLIMIT_NPROC bounds its processes (the user's, counted now)."""
    return {**LIMITS, **({} if cgroup else {"max_tasks": uid_tasks() + tasks})}


def _read_start(sock: socket.socket, timeout_s: float) -> Ready | LoadFailed:
    """A worker's first message, read from a blocking socket (start-up, outside the event loop)."""
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
        raise violation(str(exc)) from None


async def _drain(stream: asyncio.StreamReader, tail: bytearray) -> None:
    with contextlib.suppress(Exception):
        while chunk := await stream.read(65536):
            tail.extend(chunk)
            del tail[: max(0, len(tail) - STDERR_TAIL)]


def _pidfd_pid(pidfd: int | None) -> int:
    """The pid a pidfd refers to (-1 once that process is gone)."""
    if pidfd is None:
        return -1
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/self/fdinfo/{pidfd}").read_text().splitlines():
            if line.startswith("Pid:"):
                return int(line.split()[1])
    return -1


class Child:
    """One loaded worker as the host holds it: its channel, the tail of its stderr (drained meanwhile), and
    the lineage digest of the last request it served (empty while fresh)."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.tail = bytearray()
        self.last = ""
        self.used = 0.0  # loop time of its last reply
        self.watch: asyncio.Task[None] | None = None  # reads the channel while it is parked (anything = broken)
        self.verdicts: dict[str, Any] = {}  # H4 verdicts it gave, by state digest: its conversation's cache
        self.baseline = 0  # its tasks once loaded (`tasks`): harness code may add at most EXTRA_TASKS for good
        self.memory_at_load = 0.0  # its `memory_mb` once loaded
        self._drain = asyncio.get_running_loop().create_task(_drain(worker.stderr, self.tail))

    def _tree(self) -> list[tuple[int, int]]:
        """(pid, threads) of each process in its process tree now (the host's /proc; empty once it is gone)."""
        pidfd = getattr(self.worker, "pidfd", None)
        root = self.worker.proc.pid if isinstance(self.worker, ProcessWorker) else _pidfd_pid(pidfd)
        out, queue = [], [root] if root > 0 else []
        while queue:
            pid = queue.pop()
            with contextlib.suppress(OSError):
                threads = os.listdir(f"/proc/{pid}/task")
                out.append((pid, len(threads)))
                for tid in threads:
                    with contextlib.suppress(OSError, ValueError):
                        queue += [int(p) for p in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
        return out

    def tasks(self) -> int:
        """Processes and threads in its process tree now."""
        return sum(threads for _, threads in self._tree())

    def memory_mb(self) -> float:
        """Anonymous memory its process tree holds now (what code allocated, not the template's shared pages)."""
        kb = 0
        for pid, _ in self._tree():
            with contextlib.suppress(OSError, ValueError, IndexError):
                kb += int(next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                               if line.startswith("RssAnon:")).split()[1])
        return kb / 1024

    def alive(self) -> bool:
        pidfd = getattr(self.worker, "pidfd", None)
        if pidfd is not None:  # a pidfd turns readable when its process exits
            return not select.select([pidfd], [], [], 0)[0]
        return self.worker.returncode is None

    async def died(self) -> str:
        """What to say of a worker that closed its channel without answering (its last stderr line)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._drain), 0.2)
        last = self.tail.decode(errors="replace").strip().splitlines()[-1:]
        return "harness code: its sandboxed worker died before answering" + (f" ({last[0][:300]})" if last else "")

    async def release(self) -> None:
        """Kill it and free what it held (reaped in the loop if it is a process of its own)."""
        if self.watch is not None and self.watch is not asyncio.current_task():
            self.watch.cancel()
        import sys as _s
        _s.stderr.write(self.tail.decode(errors="replace"))
        if isinstance(self.worker, ProcessWorker):
            await self.worker.aclose()
        else:
            self.worker.discard()
        self._drain.cancel()


class Children:
    """Starts sandboxed workers for one harness (a template that forks them, else fresh processes)."""

    def __init__(self, files: dict[str, str], max_tasks: int) -> None:
        self.files = files
        self.max_tasks = max_tasks
        self.isolation = ""
        self.closed = False
        self._dir = ""
        self._root = ""
        self._server: ForkServer | None = None
        self._forked: list[Forked] = []  # forked at start-up, not yet handed out
        self._lock = threading.Lock()
        self._threads = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="serve-fork")

    @property
    def forks(self) -> bool:
        """Whether workers are forked from the template (else each is a fresh process)."""
        return self._server is not None

    def start(self, ahead: int = 0) -> str:
        """Copy the harness, start the template and load the harness code once in a worker (blocking), then fork
        `ahead` workers for the first requests. Returns the isolation workers get; LayerCodeError with the
        harness code's error if it does not load."""
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
        if self._server is not None:
            with contextlib.suppress(LayerCodeError):
                self._forked = [self._fork() for _ in range(ahead)]
        return self.isolation

    def load_once(self) -> str:
        """Load the harness code once in a fresh confined worker process (no template; blocking) and end it.
        Returns the isolation it got; LayerCodeError with the harness code's error if it does not load."""
        from ..harness.manifest import version_from_files

        self._dir = tempfile.mkdtemp(prefix="ecdysis-load-")
        try:
            self._root = str(version_from_files(self.files, origin="harness").write(Path(self._dir) / "harness"))
            start = self._probe_process()
        finally:
            self.close()
        if isinstance(start, LoadFailed):
            raise LayerCodeError(start.error)
        return start.isolation

    def _start_server(self) -> ForkServer | None:
        limits = _limits(self.max_tasks, pids_cgroup_root() is not None)
        return ForkServer.start(SRC_ROOT, worker_env("/sandbox"), SandboxView(read_only=(self._root,)),
                                max_tasks=self.max_tasks, module=ZYGOTE, args=(self._root, json.dumps(limits)))

    def _process_command(self) -> tuple[list[str], dict[str, str], str, Any, str]:
        """(argv, env, workdir, cgroup, measures) of a fresh worker process (the fallback)."""
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
            raise violation(str(exc)) from None

    def _fork(self) -> Forked:
        """A worker forked from the template (blocking, a few ms); a new template if the old one died."""
        server = self._server
        assert server is not None
        try:
            return server.fork()
        except ZygoteError as exc:
            if server.alive():  # the process budget is spent: a fork bomb in a request running now
                raise LayerCodeError(f"no sandboxed worker could be forked for this request ({exc})") from None
        with self._lock:
            if self._server is server and not self.closed:
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

    async def prepare(self) -> Child:
        """A fresh worker that has loaded the harness code and waits for requests."""
        forked = None
        while self._forked and forked is None:
            forked = self._forked.pop(0)
            if self._server is None or not forked.alive():
                forked.close()
                forked = None
        if self._server is None:
            worker: Worker = await self._start_process()
        else:
            if forked is None:
                forked = await asyncio.wrap_future(self._threads.submit(self._fork))
            assert self._server is not None
            worker = await forked.open(self._server)
        child = Child(worker)
        try:
            start = await asyncio.wait_for(read_message(worker.reader, StartMessage), LOAD_TIMEOUT_S)
        except ProtocolError as exc:
            await child.release()
            raise violation(str(exc)) from None
        except (TimeoutError, OSError) as exc:
            await child.release()
            raise LayerCodeError(f"the sandboxed harness code did not load ({exc.__class__.__name__})") from None
        except BaseException:  # cancelled (shutting down): not left running
            await child.release()
            raise
        if not isinstance(start, Ready):
            await child.release()
            raise LayerCodeError(start.error if start is not None else await child.died())
        child.baseline, child.memory_at_load = child.tasks(), child.memory_mb()
        return child

    def close(self) -> None:
        """End the template (and with it every worker it forked) and remove the harness copy."""
        self.closed = True
        for forked in self._forked:
            forked.close()
        self._forked = []
        self._threads.shutdown(wait=True)
        with self._lock:
            server, self._server = self._server, None
        if server is not None:
            server.close()
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)


def probe(files: dict[str, str]) -> str:
    """Import a harness's code once in a sandboxed worker (never in this process); the isolation it got.
    LayerCodeError with the harness code's error (an import that fails, a missing function)."""
    return Children(files, TASK_MARGIN).load_once()
