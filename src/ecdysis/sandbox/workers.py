"""Sandboxed worker processes: a fresh interpreter per episode, or a fork of a confined zygote.

A worker serves exactly one episode over a JSON-lines channel and is then killed; nothing carries over
between episodes. `WorkerPool` hands out workers: forked from a zygote per sandbox shape where per-episode
namespaces are available (a few ms instead of ~250 ms of interpreter start-up and imports), otherwise
fresh processes started ahead of need.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import shutil
import signal
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from .confine import TASK_MARGIN, PidsCgroup, confine_argv, pids_cgroup, sweep_cgroups
from .forkserver import STREAM_LIMIT, Forked, ForkServer, ZygoteError
from .view import SandboxView

SRC_ROOT = str(Path(__file__).resolve().parents[2])


def worker_env(workdir: str) -> dict[str, str]:
    """A minimal environment: no API keys or other secrets reach harness code."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": workdir,
        "TMPDIR": workdir,
        "LANG": "C.UTF-8",
        "PYTHONPATH": SRC_ROOT,
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0",
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # τ²'s dependency would otherwise fetch over the network
        "PYDANTIC_DISABLE_PLUGINS": "__all__",  # no entry-point scan at the first model class: faster start
    }
    env.update({k: v for k, v in os.environ.items() if k.startswith("OPENBLAS_CORE") or k == "OPENBLAS_L2_SIZE"})
    return env


class Worker(Protocol):
    """One episode's worker as the host sees it: the channel, the worker's stderr, and its end."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    stderr: asyncio.StreamReader
    confined: str  # the OS measures it runs under, e.g. "bwrap+episode-ns+pids-cgroup"
    returncode: int | None  # exit status if known (negative: killed by that signal)

    def kill(self) -> None: ...

    def lost(self) -> bool:
        """Whether the infrastructure lost the episode (its zygote died), rather than the episode failing."""
        ...

    def exited(self, status: int | None) -> None:
        """The exit status reported over the channel (a forked worker's parent sends it)."""
        ...

    def waiting(self) -> None:
        """The episode now waits on a model call: the moment for background work (forking the next one)."""
        ...

    async def wait(self) -> int | None: ...

    def discard(self) -> None:
        """Kill it if still running and release what it held (working directory, cgroup)."""
        ...


@dataclass
class ProcessWorker:
    """A started worker process waiting for its one request, with its working directory (removed after use)."""

    proc: asyncio.subprocess.Process
    confined: str
    workdir: str
    loop: asyncio.AbstractEventLoop
    cgroup: PidsCgroup | None = None

    @property
    def reader(self) -> asyncio.StreamReader:
        assert self.proc.stdout is not None
        return self.proc.stdout

    @property
    def writer(self) -> asyncio.StreamWriter:
        assert self.proc.stdin is not None
        return self.proc.stdin

    @property
    def stderr(self) -> asyncio.StreamReader:
        assert self.proc.stderr is not None
        return self.proc.stderr

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def lost(self) -> bool:
        return False  # a worker process has nobody else to be lost by

    def exited(self, status: int | None) -> None:
        return None  # its own exit status comes from the process itself

    def waiting(self) -> None:
        return None  # the next spare process was started when this one was taken

    async def wait(self) -> int | None:
        return await self.proc.wait()

    def discard(self) -> None:
        self.kill()
        shutil.rmtree(self.workdir, ignore_errors=True)
        if self.cgroup is not None and self.proc.returncode is not None:
            self.cgroup.remove()

    async def aclose(self) -> None:
        """Kill and reap (in its own event loop, so its pipes close cleanly), then remove the workdir."""
        self.kill()
        if self.loop is asyncio.get_running_loop():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.proc.wait(), timeout=10)
        self.discard()


async def start_worker(view: SandboxView | None = None) -> ProcessWorker:
    """A fresh worker process in its own session (so the whole group can be killed), confined by
    bubblewrap where available (seeing `view` besides the runtime), in a pids-limited cgroup where one
    can be made."""
    view = view or SandboxView()
    workdir = tempfile.mkdtemp(prefix="ecdysis-sbx-")
    command = [sys.executable, "-m", "ecdysis.sandbox.worker"]
    env = worker_env(workdir)
    confined = confine_argv(command, env, SRC_ROOT, list(view.read_only), list(view.hidden))
    cgroup = pids_cgroup()
    proc = await asyncio.create_subprocess_exec(
        *(confined or command),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        cwd=workdir, env=env if confined is None else {}, start_new_session=True, limit=STREAM_LIMIT,
        preexec_fn=cgroup.enter if cgroup else None,
    )
    measures = [m for m, on in (("bwrap", confined), ("pids-cgroup", cgroup)) if on]
    return ProcessWorker(proc, "+".join(measures), workdir, asyncio.get_running_loop(), cgroup)


class WorkerPool:
    """Hands out one worker per episode. Per harness version and sandbox shape (view, environment)
    it keeps a zygote that forks episodes (it holds no event-loop state and runs no harness code), with one
    episode forked ahead; where no zygote can run, it starts fresh processes ahead of need instead.
    `drain` (called when a batch ends) kills what was made ahead and ends the zygotes with no episode in
    flight but the latest one, so idle workers never outlive the evaluation they were started for; a zygote
    for the next harness version is started ahead (`prepare`), and claimed by its first episode.
    `slots`: episodes run at once, which sizes a zygote's process budget."""

    def __init__(self, slots: int = 4) -> None:
        self.max_tasks = TASK_MARGIN * (max(slots, 1) + 1) + 8  # each episode's margin, a spare, the zygote
        self._servers: dict[tuple[Any, ...], concurrent.futures.Future[ForkServer | None]] = {}
        self._unclaimed: dict[tuple[Any, ...], concurrent.futures.Future[ForkServer | None]] = {}  # by shape
        self._latest: tuple[Any, ...] | None = None
        self._no_zygotes = False  # set once a zygote could not run here: then only fresh processes
        self._threads = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="zygote")
        self._forked: dict[tuple[Any, ...], list[Forked]] = {}  # forked ahead, waiting for their request
        self._refilling: set[tuple[Any, ...]] = set()
        self._spares: dict[SandboxView, list[ProcessWorker]] = {}
        self._starting: set[asyncio.Task[None]] = set()
        self._generation = 0  # bumped by drain(): spares still starting then are discarded on arrival

    def prepare(self, view: SandboxView, env_name: str = "") -> None:
        """Start a zygote for episodes of this shape ahead of need (off the event loop: its imports take a
        moment); the next harness version to run claims it."""
        shape = (view, env_name)
        if shape not in self._unclaimed and not self._no_zygotes:
            self._unclaimed[shape] = self._threads.submit(ForkServer.start, SRC_ROOT, worker_env("/sandbox"),
                                                          view, env_name, self.max_tasks)

    async def take(self, view: SandboxView, env_name: str = "", harness_id: str = "") -> Worker:
        shape = (view, env_name)
        key = self._latest = (*shape, harness_id)
        if self._no_zygotes:
            return await self._take_process(view)
        if key not in self._servers:  # the first episode of this harness version claims a prepared zygote
            self.prepare(view, env_name)
            self._servers[key] = self._unclaimed.pop(shape)
        future = self._servers[key]
        try:
            server = await asyncio.wrap_future(future)
        except Exception:  # noqa: BLE001 - a zygote that failed to start means fresh processes, not a failed run
            server = None
        if server is None:  # no nested namespaces (or no bubblewrap) here: do not try again for every batch
            self._no_zygotes = True
        else:
            try:
                return await self._take_forked(key, server)
            except ZygoteError:
                if not server.alive():  # gone: this episode gets a fresh process, the next a new zygote
                    server.close()
                    if self._servers.get(key) is future:
                        del self._servers[key]
        return await self._take_process(view)

    async def _take_forked(self, key: tuple[Any, ...], server: ForkServer) -> Worker:
        """A spare forked ahead if one is ready, else one forked now. Once the episode waits on its model, one
        more is forked in the background, so the next episode finds its namespaces and mounts already made."""
        if not server.alive():  # its spares may not have noticed yet: none of them is handed out
            raise ZygoteError("the zygote is gone")
        spares, forked = self._forked.setdefault(key, []), None
        while spares and forked is None:
            candidate = spares.pop()
            if candidate.alive():
                forked = candidate
            else:
                candidate.close()
        if forked is None:
            forked = await asyncio.wrap_future(self._threads.submit(server.fork))
        return await forked.open(server, lambda: self._refill_soon(key, server))

    def _refill_soon(self, key: tuple[Any, ...], server: ForkServer) -> None:
        """Fork the next episode in the background unless one is ready or on its way. Called when an episode
        waits on its model, so the fork's CPU does not delay that episode's own start."""
        if key not in self._refilling and not self._forked.get(key):
            self._refilling.add(key)
            self._threads.submit(self._refill, key, server, self._generation)

    def _refill(self, key: tuple[Any, ...], server: ForkServer, generation: int) -> None:
        try:
            forked = server.fork()
        except (ZygoteError, OSError):
            return
        finally:
            self._refilling.discard(key)
        if generation != self._generation:
            forked.close()
        else:
            self._forked.setdefault(key, []).append(forked)

    async def _take_process(self, view: SandboxView) -> ProcessWorker:
        loop = asyncio.get_running_loop()
        spares, worker = self._spares.setdefault(view, []), None
        while spares and worker is None:
            candidate = spares.pop()
            if candidate.loop is loop and candidate.proc.returncode is None:
                worker = candidate
            else:
                candidate.discard()
        task = loop.create_task(self._start_spare(view, self._generation))
        self._starting.add(task)
        task.add_done_callback(self._starting.discard)
        return worker or await start_worker(view)

    async def _start_spare(self, view: SandboxView, generation: int) -> None:
        try:
            worker = await start_worker(view)
        except OSError:
            return
        if generation != self._generation:
            await worker.aclose()
        else:
            self._spares.setdefault(view, []).append(worker)

    async def drain(self) -> None:
        """Kill the spare processes (and those still starting): the batch that needed them has ended."""
        self._generation += 1
        if self._starting:
            await asyncio.gather(*self._starting, return_exceptions=True)
        workers = [w for spares in self._spares.values() for w in spares]
        self._spares.clear()
        for worker in workers:
            await worker.aclose()
        self._close_forked()
        for key, future in list(self._servers.items()):
            server = _started(future)
            if key != self._latest and (server is None or server.in_flight == 0):
                del self._servers[key]
                future.add_done_callback(_close_server)  # now, or once a zygote still starting has started
        if self._latest is not None:  # the next harness version will find its zygote started
            self.prepare(self._latest[0], self._latest[1])

    def _close_forked(self) -> None:
        forked = [f for spares in self._forked.values() for f in spares]
        self._forked.clear()
        for spare in forked:
            spare.close()

    def close(self) -> None:
        """Outside an event loop (the workspace closing): end the zygotes, kill whatever is left."""
        self._generation += 1
        for spares in self._spares.values():
            for worker in spares:
                worker.discard()
        self._spares.clear()
        self._close_forked()
        for future in [*self._servers.values(), *self._unclaimed.values()]:
            future.add_done_callback(_close_server)  # runs now if started, else once it has
        self._servers.clear()
        self._unclaimed.clear()
        self._threads.shutdown(wait=False)  # a start still running finishes, then its callback ends the zygote
        sweep_cgroups()


def _started(future: concurrent.futures.Future[ForkServer | None]) -> ForkServer | None:
    """The zygote a start produced, None while starting or if it failed or could not run here."""
    return future.result() if future.done() and not future.cancelled() and not future.exception() else None


def _close_server(future: concurrent.futures.Future[ForkServer | None]) -> None:
    server = _started(future)
    if server is not None:
        server.close()
