"""Sandbox worker: runs one episode of possibly model-written harness code.

Started by the host as `python -m ecdysis.sandbox.worker` in a private temporary directory with a
secret-free environment (or forked from a zygote). Protocol (`protocol`): the host sends one request, the
worker answers with `chat` and `user` calls (the host holds models, keys, cache, the user's scenario) and
finally one `done` report of what the agent did. Before harness code runs, the worker enters a fresh network
namespace where the OS allows it (without bubblewrap), applies resource limits, installs an audit hook that
refuses sockets, subprocesses and further limit changes, and tells the host which of these took effect
(`started`). Harness code can reach this channel too, so the host believes nothing on it but what the agent
did: it builds the trajectory's other fields itself.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import json
import os
import resource
import socket
import sys
import traceback
from pathlib import Path
from typing import IO, Any

from pydantic import BaseModel

from ..agent.trajectory import Trajectory
from .framing import ProtocolError, decode, encode
from .protocol import (
    AGENT_ENDINGS,
    CALL_KINDS,
    HOST_REQUEST,
    ChatCall,
    ChatReply,
    DoneReport,
    EpisodeReport,
    EpisodeRequest,
    RealizedReply,
    ReplayRequest,
    ReplayResult,
    Started,
    UserCall,
    UserReply,
)

CLONE_NEWNET = 0x40000000
IN_PROCESS = ("netns", "rlimits", "audit-hook")  # measures `isolate` may report besides the host's
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
    """The channel to the host (the wire protocol of `protocol`) on private copies of stdin/stdout."""

    def __init__(self, inp: IO[str], out: IO[str]) -> None:
        self.inp, self.out = inp, out
        self._ids = itertools.count(1)

    def send(self, message: BaseModel | dict[str, Any]) -> None:
        self.out.write(encode(message).decode())
        self.out.flush()

    def receive(self) -> dict[str, Any]:
        """The next line as a JSON object, untyped (`serve`'s worker, whose channel is not this protocol)."""
        line = self.inp.readline()
        if not line:
            raise EOFError("host closed the channel")
        return json.loads(line)

    def receive_as(self, schema: Any) -> Any:
        """The next message, validated against `schema` (a model or a TypeAdapter)."""
        line = self.inp.readline()
        if not line:
            raise EOFError("host closed the channel")
        return decode(line, schema)

    def _call(self, message: ChatCall | UserCall, reply: Any) -> Any:
        self.send(message)
        answer = self.receive_as(reply)
        if answer.id != message.id:
            raise ProtocolError(f"the host's reply is for call {answer.id}, not {message.id}")
        return answer

    def chat(self, messages: list[dict[str, Any]], params: dict[str, Any]) -> dict[str, Any]:
        """The model's reply {"text", "tool_calls", "finish_reason", "call"} or {"error"}."""
        reply = self._call(ChatCall(id=next(self._ids), messages=messages, params=params), ChatReply)
        if reply.error is not None:
            return {"error": reply.error}
        return {"text": reply.text, "tool_calls": reply.tool_calls, "finish_reason": reply.finish_reason,
                "call": reply.id}

    def user(self, conversation: list[dict[str, str]]) -> dict[str, Any]:
        """The simulated user's next message (the host holds the scenario and the user model)."""
        reply = self._call(UserCall(id=next(self._ids), conversation=conversation), UserReply)
        if reply.error is not None:
            return {"error": reply.error}
        return {"text": reply.text, "stop": reply.stop, "limit": reply.limit, "reason": reply.reason,
                "call": reply.id}


def replay(request: ReplayRequest) -> ReplayResult:
    """Realize stored replies with a candidate's H2 (no model calls). Per item: one result per reply."""
    from ..agent.loop import load_realize
    from ..agent.realize import replay_item
    from ..harness.manifest import version_from_files
    from ..harness.repairs import REPAIRS_FILE, parse_repairs

    try:
        harness_dir = Path.cwd() / "harness"
        harness = version_from_files(request.files, origin="harness")
        harness.write(harness_dir)
        limits = request.limits
        isolate(limits.memory_mb, limits.cpu_s, limits.file_mb, request.confined, limits.max_tasks)
        sys.path.insert(0, str(harness_dir))  # only now: a harness file cannot shadow a module imported before
        realize = load_realize(harness, harness_dir)
        repairs = parse_repairs(harness.files.get(REPAIRS_FILE))
        return ReplayResult(results=[[RealizedReply.model_validate(r) for r in replay_item(realize, repairs, item)]
                                     for item in request.items])
    except BaseException:  # noqa: BLE001 - candidate code failing replay is a result
        return ReplayResult(error=traceback.format_exc(limit=10))


def _report(traj: Trajectory, ending: str, final_state: Any, tb: str | None) -> EpisodeReport:
    """What the agent did, as the host takes it: model and user events name their call (the host has the
    rest). A record that does not fit the protocol (harness code may have changed it) is the harness's crash."""
    if ending not in AGENT_ENDINGS:
        tb = f"{tb or ''}\nthe episode's ending was set to {str(ending)[:100]!r}, which only the host gives".strip()
        ending = "crash"
    events = [{k: e[k] for k in ("kind", "turn", "call", "unchosen") if k in e}
              if e.get("kind") in CALL_KINDS and "call" in e else e for e in traj.events]
    try:
        return EpisodeReport(ending=ending, events=events, final_answer=traj.final_answer,  # type: ignore[arg-type]
                             final_state=final_state, conversation=traj.conversation, traceback=tb)
    except Exception as exc:  # noqa: BLE001
        return _unfit(tb, exc)


def _unfit(tb: str | None, exc: Exception) -> EpisodeReport:
    return EpisodeReport(ending="crash", traceback=f"{tb or ''}\nthe episode's record does not fit the protocol: "
                                                   f"{str(exc)[:2000]}".strip())


def send_report(link: HostLink, report: EpisodeReport) -> None:
    """Send the `done` report; one holding a value that is not JSON (harness code put it there) is a crash."""
    try:
        line = encode(DoneReport(report=report))
    except Exception as exc:  # noqa: BLE001
        line = encode(DoneReport(report=_unfit(report.traceback, exc)))
    link.out.write(line.decode())
    link.out.flush()


def run(request: EpisodeRequest, link: HostLink) -> EpisodeReport:
    """Run one episode; its report (a failure of harness code is a `crash` with the traceback)."""
    from ..agent.loop import ModelFailure, run_episode
    from ..envs import make_episode
    from ..harness.manifest import version_from_files

    traj = Trajectory(task_id=str(request.task.get("id", "")), trial=request.trial, harness_id=request.harness_id)
    episode, final_state, ending, tb = None, {}, "crash", None
    try:
        harness_dir = Path.cwd() / "harness"
        harness = version_from_files(request.files, origin="harness")
        harness.write(harness_dir)
        sys.path.extend(request.plugin_paths)
        episode = make_episode(request.env, request.task["public"], request.env_options)
        limits = request.limits
        measures = isolate(limits.memory_mb, limits.cpu_s, limits.file_mb, request.confined, limits.max_tasks)
        link.send(Started(measures=[m for m in measures.split("+") if m in IN_PROCESS]))
        sys.path.insert(0, str(harness_dir))  # only now: a harness file cannot shadow the environment's imports
        user = link.user if request.has_user else None
        run_episode(harness, harness_dir, request.task, episode, link.chat, traj, trial=request.trial, user=user)
        final_state, ending = episode.final_state(), traj.termination
    except ModelFailure as exc:
        ending, tb = "model_error", str(exc)
    except BaseException:  # noqa: BLE001 - any failure of harness code is a recorded outcome
        tb = traceback.format_exc(limit=20)
        if episode is not None:
            try:
                final_state = episode.final_state()
            except BaseException:  # noqa: BLE001
                pass
    return _report(traj, ending, final_state, tb)


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
    request = link.receive_as(HOST_REQUEST)
    if isinstance(request, ReplayRequest):
        link.send(replay(request))
    else:
        send_report(link, run(request, link))
    return 0


if __name__ == "__main__":
    sys.exit(main())
