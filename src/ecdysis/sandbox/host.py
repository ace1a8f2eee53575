"""Host side of the sandbox: take a worker, serve its model calls, enforce the task timeout.

A worker that crashes, hangs, exceeds a limit or is killed yields a failed trajectory that
keeps the model calls the host served and the tail of the worker's stderr.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ..agent.trajectory import INFRA_ERROR, Trajectory
from ..envs.base import Task
from ..harness.manifest import HarnessVersion
from .confine import TASK_MARGIN, uid_tasks
from .view import SandboxView
from .workers import WorkerPool, start_worker

ChatHandler = Callable[[list[dict[str, Any]], dict[str, Any]], Awaitable[dict[str, Any]]]
UserHandler = Callable[[list[dict[str, str]]], Awaitable[dict[str, Any]]]
STDERR_TAIL = 8000


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


async def _drain(stream: asyncio.StreamReader, sink: bytearray) -> None:
    while chunk := await stream.read(65536):
        sink.extend(chunk)
        if len(sink) > STDERR_TAIL:
            del sink[: len(sink) - STDERR_TAIL]


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
    harness failures.

    `user` serves the simulated user's turns (conversation tasks); `view` is what the episode sees of the
    host besides the runtime (the plugin's code and declared files, hidden paths masked; its import paths
    go on the worker's import path); `pool` supplies the worker (forked, or started ahead of time).
    """
    view = view or SandboxView()
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
        "plugin_paths": list(view.import_paths),
    }
    result: Trajectory | None = None
    termination, detail = "crash", ""
    worker = await (pool.take(view, env_name, harness.id) if pool else start_worker(view))
    request["confined"] = worker.confined
    try:
        drain = asyncio.create_task(_drain(worker.stderr, stderr))

        async def send(message: dict[str, Any]) -> None:
            worker.writer.write((json.dumps(message) + "\n").encode())
            await worker.writer.drain()

        async def converse() -> Trajectory | None:
            await send(request)
            while line := await worker.reader.readline():
                message = json.loads(line)
                if message.get("op") == "done":
                    return Trajectory.from_dict(message["trajectory"])
                if message.get("op") == "exit":  # a forked worker's end, reported by its parent
                    status = message.get("status")
                    worker.exited(status if isinstance(status, int) else None)
                    return None
                if message.get("op") == "user" and user is not None:
                    reply = await user(message["conversation"])
                else:
                    worker.waiting()
                    reply = await chat(message["messages"], message["params"])
                    served.append({"messages": message["messages"], **reply})
                await send(reply)
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
            worker.kill()
            await worker.wait()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(drain, timeout=5)
        if result is None and termination == "crash" and worker.lost():  # EOF or a reset: the zygote's doing
            termination, detail = INFRA_ERROR, f"the zygote that forked this episode died ({detail})"
    finally:
        worker.discard()
    if result is None:
        result = _failed(harness.id, task.id, trial, termination, detail, served, stderr, worker.returncode)
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
