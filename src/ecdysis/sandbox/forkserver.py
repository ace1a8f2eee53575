"""Host side of the fork server: a confined zygote per harness and sandbox shape forks one worker per episode.

Starting a worker interpreter and importing the agent loop costs ~160 ms of CPU per episode; a fork of a
pre-imported zygote costs a few milliseconds. The zygote (`sandbox/zygote.py`) runs under the same
bubblewrap confinement a worker gets and never runs harness code; each episode it forks gets namespaces
of its own (`sandbox/nested.py`: private tmpfs mounts, PID, network, IPC) and the worker's rlimits and
audit hook. Nothing an episode does is visible to another episode, to the zygote or to the host.

Processes are bounded by one pids cgroup per zygote, entered when it starts. A zygote serves one harness
version, so a harness that fork-bombs exhausts only its own episodes' budget. (Moving each episode into a
cgroup of its own would take the kernel's global cgroup lock for milliseconds per episode, which stalls
every process on the machine that starts a thread meanwhile, a model server included.)

Where bubblewrap is missing or the kernel refuses nested namespaces, `ForkServer.start` returns None and
the caller starts a fresh worker process per episode instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .confine import PidsCgroup, confine_argv, pids_cgroup
from .framing import MAX_LINE
from .view import SandboxView

STREAM_LIMIT = MAX_LINE  # a stream's buffer: a longer protocol line is a ProtocolError, not a host's memory
READY_TIMEOUT_S = 120.0
FORK_TIMEOUT_S = 30.0


class ZygoteError(RuntimeError):
    """The zygote is gone or could not fork: the caller falls back to a fresh worker process."""


def _ns_pid(host_pid: int) -> int | None:
    """The pid `host_pid` has in its innermost PID namespace (last field of NSpid), None if it is gone."""
    try:
        for line in Path(f"/proc/{host_pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    except (OSError, ValueError):
        return None
    return None


def _children(host_pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{host_pid}/task/{host_pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


@dataclass
class Forked:
    """A forked episode not yet handed out (no event-loop state: it may wait in a pool): its channel and
    stderr sockets, and a pidfd of the zygote's child that runs it (killing that child kills the episode's
    whole PID namespace)."""

    channel: socket.socket
    stderr: socket.socket
    pidfd: int
    confined: str

    def alive(self) -> bool:
        return not select.select([self.pidfd], [], [], 0)[0]  # a pidfd turns readable when its process exits

    async def open(self, server: ForkServer, on_wait: Callable[[], None] | None = None) -> ForkedWorker:
        """Handed out: its channel and stderr as streams of the running event loop. `on_wait` runs the first
        time the episode waits on a model call."""
        reader, writer = await asyncio.open_unix_connection(sock=self.channel, limit=STREAM_LIMIT)
        err_reader, err_writer = await asyncio.open_unix_connection(sock=self.stderr, limit=STREAM_LIMIT)
        server.in_flight += 1
        return ForkedWorker(reader, writer, err_reader, self.confined, self.pidfd, server, on_wait=on_wait,
                            stderr_writer=err_writer)

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError, OSError):
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        self.channel.close()
        self.stderr.close()
        os.close(self.pidfd)


@dataclass
class ForkedWorker:
    """One forked episode as the sandbox host drives it (the `Worker` protocol of `sandbox/workers.py`)."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    stderr: asyncio.StreamReader
    confined: str
    pidfd: int
    server: ForkServer
    returncode: int | None = None
    on_wait: Callable[[], None] | None = None
    stderr_writer: asyncio.StreamWriter | None = None  # unused, but its transport holds the socket open
    _closed: bool = field(default=False, repr=False)

    def waiting(self) -> None:
        if self.on_wait is not None:
            on_wait, self.on_wait = self.on_wait, None
            on_wait()

    def kill(self) -> None:
        if not self._closed:
            with contextlib.suppress(ProcessLookupError, OSError):
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)

    def exited(self, status: int | None) -> None:
        self.returncode = status

    def lost(self) -> bool:
        """Whether the episode ended because its zygote died (no exit status came): not the harness's doing."""
        return self.returncode is None and self.server.gone()

    async def wait(self) -> int | None:
        """The exit status its parent reported, if any. Nothing to wait for: the zygote reaps its children,
        and a killed episode cannot write to the store, so the next episode need not wait for it to go."""
        return self.returncode

    def discard(self) -> None:
        self.kill()
        if self._closed:
            return
        self._closed = True
        self.writer.close()
        if self.stderr_writer is not None:
            self.stderr_writer.close()
        os.close(self.pidfd)
        self.server.in_flight -= 1


class ForkServer:
    """A confined zygote for one harness version and sandbox view (the plugin's code and declared files
    read-only, hidden paths masked), in a pids cgroup of its own."""

    def __init__(self, proc: subprocess.Popen[bytes], control: socket.socket, cgroup: PidsCgroup | None,
                 stderr: tempfile._TemporaryFileWrapper[bytes]) -> None:
        self.proc, self.control, self.cgroup, self._stderr = proc, control, cgroup, stderr
        self.host_pid = 0
        self.in_flight = 0  # episodes handed out and not yet discarded
        self.confined = "+".join(["bwrap", "episode-ns", *(["pids-cgroup"] if cgroup else [])])

    @classmethod
    def start(cls, src_root: str, env: dict[str, str], view: SandboxView, env_name: str = "",
              max_tasks: int = 64, module: str = "ecdysis.sandbox.zygote",
              args: tuple[str, ...] | None = None) -> ForkServer | None:
        """Start and wait for the zygote (blocking: call it off the event loop); it sees `view` and imports
        the environment from its import paths; it and every episode it forks may hold `max_tasks` processes
        and threads in all. None where per-episode namespaces are unavailable (no bubblewrap, no nested user
        namespaces). `module` and `args`: another zygote speaking the same control protocol (`serve`'s, which
        forks one worker per conversation), with its own command-line arguments."""
        plugin = [env_name, *view.import_paths] if env_name else []
        command = [sys.executable, "-m", module, *(plugin if args is None else args)]
        argv = confine_argv(command, env, src_root, list(view.read_only), list(view.hidden))
        if argv is None or not hasattr(os, "pidfd_open"):
            return None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        cgroup = pids_cgroup(max_tasks)
        stderr = tempfile.TemporaryFile()
        proc = subprocess.Popen(argv, stdin=theirs, stdout=subprocess.DEVNULL, stderr=stderr, env={},
                                start_new_session=True, preexec_fn=cgroup.enter if cgroup else None)
        theirs.close()
        server = cls(proc, ours, cgroup, stderr)
        try:
            ours.settimeout(READY_TIMEOUT_S)
            ready = json.loads(ours.recv(4096) or b"{}")
            if not ready.get("nested"):
                raise ZygoteError("nested namespaces are unavailable")
            server.host_pid = server._find(proc.pid, int(ready["pid"]))
        except (OSError, ValueError, KeyError, ZygoteError):
            server.close()
            return None
        ours.settimeout(FORK_TIMEOUT_S)
        return server

    def _find(self, root: int, ns_pid: int) -> int:
        """The host pid of the process below `root` whose innermost pid is `ns_pid`."""
        queue = _children(root)
        while queue:
            pid = queue.pop(0)
            if _ns_pid(pid) == ns_pid:
                return pid
            queue.extend(_children(pid))
        raise ZygoteError(f"process {ns_pid} not found below {root}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def gone(self) -> bool:
        """Whether the zygote has died, allowing it a moment to be seen dead after its episodes' channels close."""
        for _ in range(20):
            if self.proc.poll() is not None:
                return True
            time.sleep(0.01)
        return False

    def fork(self) -> Forked:
        """Fork an episode, ready for its request (it enters and seals its namespaces, then waits for the
        request on the channel). Blocking for a few ms: call it off the event loop. Raises ZygoteError if
        the zygote is gone or could not fork (its process budget is spent)."""
        channel, channel_child = socket.socketpair()
        stderr, stderr_child = socket.socketpair()
        try:
            try:
                socket.send_fds(self.control, [b"fork"], [channel_child.fileno(), stderr_child.fileno()])
                reply = json.loads(self.control.recv(4096) or b"{}")
            except (OSError, ValueError) as exc:
                raise ZygoteError(f"the zygote did not answer: {exc}") from exc
            finally:
                channel_child.close()
                stderr_child.close()
            if "pid" not in reply:
                raise ZygoteError(f"the zygote could not fork: {reply.get('error') or self.stderr_tail()}")
            host_pid = self._find(self.host_pid, int(reply["pid"]))
            pidfd = os.pidfd_open(host_pid)
            if _ns_pid(host_pid) != int(reply["pid"]):  # exited and reused before the pidfd was taken
                os.close(pidfd)
                raise ZygoteError("the forked child exited before it could start")
            return Forked(channel, stderr, pidfd, self.confined)
        except BaseException:
            channel.close()
            stderr.close()
            raise

    def stderr_tail(self) -> str:
        with contextlib.suppress(OSError):
            self._stderr.seek(0)
            return self._stderr.read()[-4000:].decode(errors="replace")
        return ""

    def close(self) -> None:
        """End the zygote: its PID namespace, and with it every episode still running, is torn down."""
        self.control.close()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        self._stderr.close()
        if self.cgroup is not None:
            self.cgroup.release()
