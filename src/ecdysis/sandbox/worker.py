"""Sandbox worker: runs one episode of possibly model-written harness code.

Started by the host as `python -m ecdysis.sandbox.worker` in a private temporary directory with a
secret-free environment. Protocol: JSON lines; the host sends one request, the worker answers
with `chat` calls (the host holds models, keys, cache) and finally one `done` message carrying the
trajectory. Before harness code runs, the worker enters a fresh network namespace where the OS
allows it, applies resource limits, and installs an audit hook that refuses sockets, subprocesses
and further limit changes; `isolation` in the trajectory says which of these took effect.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import socket
import sys
import traceback
from pathlib import Path
from typing import IO, Any

CLONE_NEWNET = 0x40000000
_BLOCKED_EVENTS = {
    "socket.connect": "network access",
    "socket.bind": "network access",
    "socket.getaddrinfo": "network access",
    "subprocess.Popen": "starting processes",
    "os.system": "starting processes",
    "os.exec": "starting processes",
    "os.posix_spawn": "starting processes",
    "os.fork": "starting processes",
    "resource.setrlimit": "changing resource limits",
    "resource.prlimit": "changing resource limits",
    "ctypes.dlopen": "loading native libraries",
}


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event == "socket.__new__" and len(args) > 1 and args[1] != socket.AF_UNIX:
        raise PermissionError("network access is disabled in the harness sandbox")
    what = _BLOCKED_EVENTS.get(event)
    if what is not None:
        raise PermissionError(f"{what} is disabled in the harness sandbox ({event})")


def isolate(memory_mb: int, cpu_s: int, file_mb: int, confined: str = "", max_tasks: int | None = None) -> str:
    """Apply in-process isolation; return a short description of everything that took effect.

    `confined` names the OS measures the host started this worker under ("bwrap": namespaces, read-only
    binds, no network; "pids-cgroup": a bound on its processes and threads). Without bwrap, a new network
    namespace is tried (works as root)."""
    parts: list[str] = [confined] if confined else []
    if "bwrap" not in confined:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.unshare(CLONE_NEWNET) == 0:
                parts.append("netns")
        except OSError:
            pass
    limits = {
        resource.RLIMIT_AS: memory_mb * 1024 * 1024,
        resource.RLIMIT_CPU: cpu_s,
        resource.RLIMIT_FSIZE: file_mb * 1024 * 1024,
    }
    if max_tasks:  # processes + threads of this uid: harness code cannot fork-bomb the machine
        limits[resource.RLIMIT_NPROC] = max_tasks
    for which, value in limits.items():
        resource.setrlimit(which, (value, value))
    parts.append("rlimits")
    sys.addaudithook(_audit)
    parts.append("audit-hook")
    return "+".join(parts)


class HostLink:
    """JSON-lines channel to the host on private copies of stdin/stdout."""

    def __init__(self, inp: IO[str], out: IO[str]) -> None:
        self.inp, self.out = inp, out

    def send(self, message: dict[str, Any]) -> None:
        self.out.write(json.dumps(message) + "\n")
        self.out.flush()

    def receive(self) -> dict[str, Any]:
        line = self.inp.readline()
        if not line:
            raise EOFError("host closed the channel")
        return json.loads(line)

    def chat(self, messages: list[dict[str, Any]], params: dict[str, Any]) -> dict[str, Any]:
        self.send({"op": "chat", "messages": messages, "params": params})
        return self.receive()

    def user(self, conversation: list[dict[str, str]]) -> dict[str, Any]:
        """The simulated user's next message (the host holds the scenario and the user model)."""
        self.send({"op": "user", "conversation": conversation})
        return self.receive()


def replay(request: dict[str, Any]) -> dict[str, Any]:
    """Realize stored replies with a candidate's H2 (no model calls). Per item: one result per reply."""
    from ..agent.loop import load_realize
    from ..agent.realize import replay_item
    from ..harness.manifest import version_from_files
    from ..harness.repairs import REPAIRS_FILE, parse_repairs

    try:
        harness_dir = Path.cwd() / "harness"
        harness = version_from_files(request["files"], origin="harness")
        harness.write(harness_dir)
        sys.path.insert(0, str(harness_dir))
        limits = request["limits"]
        isolate(limits["memory_mb"], limits["cpu_s"], limits["file_mb"], request.get("confined", ""),
                limits.get("max_tasks"))
        realize = load_realize(harness, harness_dir)
        repairs = parse_repairs(harness.files.get(REPAIRS_FILE))
        results = [replay_item(realize, repairs, item) for item in request["items"]]
        return {"results": results}
    except BaseException:  # noqa: BLE001 - candidate code failing replay is a result
        return {"error": traceback.format_exc(limit=10)}


WORKER_NICENESS = 10


def yield_cpu() -> None:
    """Run at WORKER_NICENESS (set, not added: a worker forked from an already niced zygote stays there), so
    sandbox work yields the cores to a model on the same machine (the embedded backend, a local server)."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, max(WORKER_NICENESS, os.getpriority(os.PRIO_PROCESS, 0)))


def main() -> int:
    yield_cpu()
    # Harness code may print: keep the protocol on a private fd and send fd 1 to stderr.
    link = HostLink(sys.stdin, os.fdopen(os.dup(1), "w", encoding="utf-8"))
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    from ..agent.loop import ModelFailure, run_episode
    from ..agent.trajectory import Trajectory
    from ..envs import make_episode
    from ..harness.manifest import version_from_files

    request = link.receive()
    if request.get("mode") == "replay":
        link.send({"op": "done", "replay": replay(request)})
        return 0
    traj = Trajectory(task_id=request["task"]["id"], trial=request["trial"], harness_id=request["harness_id"])
    episode = None
    try:
        harness_dir = Path.cwd() / "harness"
        harness = version_from_files(request["files"], origin="harness")
        harness.write(harness_dir)
        sys.path.insert(0, str(harness_dir))
        sys.path.extend(request.get("plugin_paths", []))
        episode = make_episode(request["env"], request["task"]["public"], request.get("env_options", {}))
        limits = request["limits"]
        traj.isolation = isolate(limits["memory_mb"], limits["cpu_s"], limits["file_mb"], request.get("confined", ""),
                                 limits.get("max_tasks"))
        user = link.user if request.get("has_user") else None
        run_episode(harness, harness_dir, request["task"], episode, link.chat, traj, trial=request["trial"], user=user)
        traj.final_state = episode.final_state()
    except ModelFailure as exc:
        traj.termination = "model_error"
        traj.traceback = str(exc)
    except BaseException:  # noqa: BLE001 - any failure of harness code is a recorded outcome
        traj.termination = "crash"
        traj.traceback = traceback.format_exc(limit=20)
        if episode is not None:
            try:
                traj.final_state = episode.final_state()
            except BaseException:  # noqa: BLE001
                pass
    link.send({"op": "done", "trajectory": traj.to_dict()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
