"""Host side of the sandbox: start a worker, serve its model calls, enforce the task timeout.

A worker that crashes, hangs, exceeds a limit or is killed yields a failed trajectory that
keeps the model calls the host served and the tail of the worker's stderr.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..agent.trajectory import Trajectory
from ..envs.base import Task
from ..harness.manifest import HarnessVersion
from .confine import TASK_MARGIN, PidsCgroup, confine_argv, pids_cgroup, uid_tasks

ChatHandler = Callable[[list[dict[str, Any]], dict[str, Any]], Awaitable[dict[str, Any]]]
UserHandler = Callable[[list[dict[str, str]]], Awaitable[dict[str, Any]]]
STDERR_TAIL = 8000
_SRC_ROOT = str(Path(__file__).resolve().parents[2])


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 300.0  # wall clock per task, model time included
    memory_mb: int = 2048  # address space of the worker
    cpu_s: int = 120  # CPU seconds of the worker itself (model time is spent in the host)
    file_mb: int = 64  # largest file the worker may write

    def for_worker(self) -> dict[str, int]:
        """The limits the worker applies to itself, with the task bound for RLIMIT_NPROC taken now."""
        return {"memory_mb": self.memory_mb, "cpu_s": self.cpu_s, "file_mb": self.file_mb,
                "max_tasks": uid_tasks() + TASK_MARGIN}


def worker_env(workdir: str) -> dict[str, str]:
    """A minimal environment: no API keys or other secrets reach harness code."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": workdir,
        "TMPDIR": workdir,
        "LANG": "C.UTF-8",
        "PYTHONPATH": _SRC_ROOT,
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0",
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # τ²'s dependency would otherwise fetch over the network
        "PYDANTIC_DISABLE_PLUGINS": "__all__",  # no entry-point scan at the first model class: faster start
    }
    env.update({k: v for k, v in os.environ.items() if k.startswith("OPENBLAS_CORE") or k == "OPENBLAS_L2_SIZE"})
    return env


async def _spawn_worker(workdir: str, read_only: list[str] | None = None, hidden: list[str] | None = None
                        ) -> tuple[asyncio.subprocess.Process, str, PidsCgroup | None]:
    """A fresh worker process in its own session (so the whole group can be killed), confined by
    bubblewrap where available, in a pids-limited cgroup where one can be made. Returns (process,
    confinement such as "bwrap+pids-cgroup", the cgroup to remove after)."""
    command = [sys.executable, "-m", "ecdysis.runner.worker"]
    env = worker_env(workdir)
    confined = confine_argv(command, env, _SRC_ROOT, read_only or [], hidden or [])
    cgroup = pids_cgroup()
    proc = await asyncio.create_subprocess_exec(
        *(confined or command),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        cwd=workdir, env=env if confined is None else {}, start_new_session=True, limit=64 * 1024 * 1024,
        preexec_fn=cgroup.enter if cgroup else None,
    )
    measures = [m for m, on in (("bwrap", confined), ("pids-cgroup", cgroup)) if on]
    return proc, "+".join(measures), cgroup


@dataclass
class Worker:
    """A started worker waiting for its one request, with its working directory (removed after use)."""

    proc: asyncio.subprocess.Process
    confined: str
    workdir: str
    loop: asyncio.AbstractEventLoop
    cgroup: PidsCgroup | None = None

    def discard(self) -> None:
        _kill(self.proc)
        shutil.rmtree(self.workdir, ignore_errors=True)
        if self.cgroup is not None and self.proc.returncode is not None:
            self.cgroup.remove()

    async def aclose(self) -> None:
        """Kill and reap (in its own event loop, so its pipes close cleanly), then remove the workdir."""
        _kill(self.proc)
        if self.loop is asyncio.get_running_loop():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.proc.wait(), timeout=10)
        self.discard()


async def start_worker(read_only: list[str] | None = None, hidden: list[str] | None = None) -> Worker:
    workdir = tempfile.mkdtemp(prefix="ecdysis-sbx-")
    proc, confined, cgroup = await _spawn_worker(workdir, read_only, hidden)
    return Worker(proc, confined, workdir, asyncio.get_running_loop(), cgroup)


class WorkerPool:
    """Workers started ahead of need, so an episode does not wait for an interpreter to start and import.
    Every worker still serves exactly one episode and is then killed: nothing carries over between
    episodes. Spares belong to the event loop that started them; `close` (called when a batch ends)
    kills the spares left, so idle workers never outlive the evaluation they were started for."""

    def __init__(self) -> None:
        self._spares: dict[tuple[Any, ...], list[Worker]] = {}
        self._starting: set[asyncio.Task[None]] = set()
        self._generation = 0  # bumped by close(): spares still starting then are discarded on arrival

    async def take(self, read_only: list[str] | None, hidden: list[str] | None) -> Worker:
        loop = asyncio.get_running_loop()
        key = (tuple(read_only or ()), tuple(hidden or ()))
        spares, worker = self._spares.setdefault(key, []), None
        while spares and worker is None:
            candidate = spares.pop()
            if candidate.loop is loop and candidate.proc.returncode is None:
                worker = candidate
            else:
                candidate.discard()
        task = loop.create_task(self._start_spare(key, read_only, hidden, self._generation))
        self._starting.add(task)
        task.add_done_callback(self._starting.discard)
        return worker or await start_worker(read_only, hidden)

    async def _start_spare(self, key: tuple[Any, ...], read_only: list[str] | None, hidden: list[str] | None,
                           generation: int) -> None:
        try:
            worker = await start_worker(read_only, hidden)
        except OSError:
            return
        if generation != self._generation:
            await worker.aclose()
        else:
            self._spares.setdefault(key, []).append(worker)

    async def drain(self) -> None:
        """Kill the spares (and those still starting): the batch that needed them has ended."""
        self._generation += 1
        if self._starting:
            await asyncio.gather(*self._starting, return_exceptions=True)
        workers = [w for spares in self._spares.values() for w in spares]
        self._spares.clear()
        for worker in workers:
            await worker.aclose()

    def close(self) -> None:
        """Outside an event loop (the workspace closing): kill whatever is left."""
        self._generation += 1
        for spares in self._spares.values():
            for worker in spares:
                worker.discard()
        self._spares.clear()


async def _drain(stream: asyncio.StreamReader, sink: bytearray) -> None:
    while chunk := await stream.read(65536):
        sink.extend(chunk)
        if len(sink) > STDERR_TAIL:
            del sink[: len(sink) - STDERR_TAIL]


def _kill(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


async def run_in_sandbox(
    harness: HarnessVersion,
    env_name: str,
    env_options: dict[str, Any],
    task: Task,
    trial: int,
    chat: ChatHandler,
    limits: SandboxLimits,
    user: UserHandler | None = None,
    plugin_paths: list[str] | None = None,
    hidden: list[str] | None = None,
    pool: WorkerPool | None = None,
) -> Trajectory:
    """Run one episode in a fresh worker process. Never raises for harness failures.

    `user` serves the simulated user's turns (conversation tasks); `plugin_paths` go on the worker's
    import path so it can import the environment plugin (bound read-only into the sandbox); `hidden`
    paths are masked inside it; `pool` supplies a worker started ahead of time.
    """
    start = time.perf_counter()
    served: list[dict[str, Any]] = []  # model calls served, kept in case the worker dies
    stderr = bytearray()
    request = {
        "files": harness.files,
        "harness_id": harness.id,
        "env": env_name,
        "env_options": env_options,
        "task": task.public_view(),
        "trial": trial,
        "limits": limits.for_worker(),
        "has_user": user is not None,
        "plugin_paths": plugin_paths or [],
    }
    result: Trajectory | None = None
    termination, detail = "crash", ""
    worker = await pool.take(plugin_paths, hidden) if pool else await start_worker(plugin_paths, hidden)
    proc, request["confined"] = worker.proc, worker.confined
    try:
        assert proc.stdin and proc.stdout and proc.stderr
        drain = asyncio.create_task(_drain(proc.stderr, stderr))

        async def converse() -> Trajectory | None:
            assert proc.stdin and proc.stdout
            proc.stdin.write((json.dumps(request) + "\n").encode())
            await proc.stdin.drain()
            while line := await proc.stdout.readline():
                message = json.loads(line)
                if message.get("op") == "done":
                    return Trajectory.from_dict(message["trajectory"])
                if message.get("op") == "user" and user is not None:
                    reply = await user(message["conversation"])
                else:
                    reply = await chat(message["messages"], message["params"])
                    served.append({"messages": message["messages"], **reply})
                proc.stdin.write((json.dumps(reply) + "\n").encode())
                await proc.stdin.drain()
            return None

        try:
            result = await asyncio.wait_for(converse(), timeout=limits.timeout_s)
            if result is None:
                detail = "the sandbox worker exited without a result"
        except TimeoutError:
            termination, detail = "timeout", f"task exceeded its {limits.timeout_s:g}s time limit"
        except (ConnectionError, json.JSONDecodeError, BrokenPipeError) as exc:
            detail = f"sandbox channel broke: {exc!r}"
        finally:
            _kill(proc)
            await proc.wait()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(drain, timeout=5)
    finally:
        worker.discard()
    if result is None:
        result = _failed(harness.id, task.id, trial, termination, detail, served, stderr, proc.returncode)
    result.wall_s = time.perf_counter() - start
    return result


async def replay_in_sandbox(files: dict[str, str], items: list[dict[str, Any]],
                            limits: SandboxLimits) -> dict[str, Any]:
    """Run the candidate's H2 over stored replies in a worker; returns {"results"} or {"error"}."""
    request = {"mode": "replay", "files": files, "items": items,
               "limits": limits.for_worker()}
    worker = await start_worker()
    request["confined"] = worker.confined
    try:
        out, err = await asyncio.wait_for(worker.proc.communicate((json.dumps(request) + "\n").encode()),
                                          timeout=limits.timeout_s)
    except TimeoutError:
        return {"error": f"replay exceeded {limits.timeout_s:g}s"}
    finally:
        await worker.aclose()
    for line in out.decode(errors="replace").splitlines():
        message = json.loads(line)
        if message.get("op") == "done":
            return message["replay"]
    return {"error": f"replay worker died: {err.decode(errors='replace')[-STDERR_TAIL:]}"}


def _failed(harness_id: str, task_id: str, trial: int, termination: str, detail: str,
            served: list[dict[str, Any]], stderr: bytearray, returncode: int | None) -> Trajectory:
    traj = Trajectory(task_id=task_id, trial=trial, harness_id=harness_id, termination=termination)
    for call in served:
        if "error" in call:
            continue
        usage = call.get("usage", {})
        traj.add("model", 0, messages=call["messages"], reply=call["text"], usage=usage,
                 tool_calls=call.get("tool_calls") or [],
                 finish_reason=call.get("finish_reason", ""), latency_s=call.get("latency_s", 0.0))
        traj.model_calls += 1
        traj.model_time_s += float(call.get("latency_s", 0.0))
        traj.prompt_tokens += int(usage.get("prompt_tokens", 0))
        traj.completion_tokens += int(usage.get("completion_tokens", 0))
    signal_note = ""
    # a direct child killed by a signal has a negative code; bwrap reports its child's signal as 128 + N
    number = -returncode if returncode is not None and returncode < 0 else (
        returncode - 128 if returncode is not None and 128 < returncode < 128 + 65 else None)
    if number is not None:
        with contextlib.suppress(ValueError):
            signal_note = f" (killed by {signal.Signals(number).name})"
    tail = stderr.decode(errors="replace").strip()
    traj.traceback = f"{detail}{signal_note}\n--- worker stderr (tail) ---\n{tail}".strip()
    return traj
