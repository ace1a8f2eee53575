"""Sandbox-side fork server: one pre-imported interpreter that forks a fresh worker per episode.

Started by the host as `python -m ecdysis.sandbox.zygote [ENV [PLUGIN_PATH...]]` under the same bubblewrap
confinement as a worker, with a SOCK_SEQPACKET control socket as stdin. It imports the agent loop and the
environment's module once (and calls the module's `preload_sandbox()` if it has one: the imports its
episodes need), and never runs harness code itself. The first message it sends is
`{"op": "ready", "pid", "nested"}`, where `nested` says whether per-episode namespaces work here (if not,
the host starts a fresh worker per episode). Per request (`fork` plus two descriptors: the episode's
channel and its stderr) it forks a child that enters fresh namespaces (`nested`), forks the episode as
PID 1 of its PID namespace and reports the episode's exit status on the channel (`protocol.ExitNote`); the
episode itself is the ordinary worker (`worker.main`) on the channel. The reply to each request is the
child's pid in the zygote's namespace, or an error if it could not fork.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import socket
import sys
import traceback
from collections.abc import Callable
from importlib import import_module

from . import nested
from .framing import encode
from .protocol import ExitNote, build_schemas
from .worker import yield_cpu

PRELOAD = ("ecdysis.agent.loop", "ecdysis.agent.trajectory", "ecdysis.envs", "ecdysis.harness.manifest",
           "ecdysis.sandbox.protocol", "ecdysis.sandbox.worker")


def _episode(channel: int, stderr: int) -> int:
    """In the sealed episode: wire the channel to stdin/stdout and stderr to fd 2, run the worker."""
    from .worker import main as worker_main

    os.dup2(channel, 0)
    os.dup2(channel, 1)
    os.dup2(stderr, 2)
    os.close(channel)
    os.close(stderr)
    return worker_main()


def _intermediate(channel: int, stderr: int) -> None:
    """The forked child: run the episode in fresh namespaces, then report on the channel how it ended."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        status = nested.run_sealed(lambda: _episode(channel, stderr))
        os.write(channel, encode(ExitNote(status=status)))
    except BaseException:  # noqa: BLE001
        os.write(stderr, f"episode setup failed in the zygote's child:\n{traceback.format_exc()}".encode())
    os._exit(0)


def main() -> int:
    yield_cpu()  # like every worker; the episodes it forks stay at this niceness
    control = take_control(PRELOAD)
    build_schemas()  # once here, not in every episode
    if len(sys.argv) > 1:  # the environment's module, found on its plugin paths as the worker finds it
        sys.path.extend(sys.argv[2:])
        with contextlib.suppress(Exception):  # an environment that does not import is the episode's to report
            module = import_module("ecdysis.envs").import_module(sys.argv[1])
            preload = getattr(module, "preload_sandbox", None)
            if callable(preload):  # what its episodes import (τ²: seconds of imports), done once for all
                preload()
    return serve_forks(control, nested.works_here(), _intermediate)


def take_control(preload: tuple[str, ...]) -> socket.socket:
    """A template's start (shared with serve's): the control socket the host gave as stdin, stdin itself then
    /dev/null, and the `preload` modules imported."""
    control = socket.socket(fileno=os.dup(0))
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for name in preload:
        import_module(name)
    return control


def serve_forks(control: socket.socket, nested_ok: bool, child: Callable[[int, int], object]) -> int:
    """The template's loop (shared with serve's): freeze what is imported, say ready (with whether nested
    namespaces work here), then fork one child per request of two descriptors (channel, stderr), `child` running
    in it; a fork the process budget refuses is answered with the error, never a crash of the template."""
    gc.freeze()  # what is imported now stays put: a child's collections do not copy the shared pages
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    control.sendall(json.dumps({"op": "ready", "pid": os.getpid(), "nested": nested_ok}).encode())
    while True:
        message, fds, _, _ = socket.recv_fds(control, 1024, 2)
        if not message:
            return 0
        if len(fds) != 2:
            for fd in fds:
                os.close(fd)
            control.sendall(json.dumps({"error": "expected two descriptors"}).encode())
            continue
        try:
            pid = os.fork()
        except OSError as exc:  # the cgroup's process budget is spent (a fork bomb in a child)
            pid, error = 0, f"fork failed: {exc}"
        else:
            if pid == 0:
                control.close()
                child(*fds)
        for fd in fds:
            os.close(fd)
        control.sendall(json.dumps({"pid": pid} if pid else {"error": error}).encode())


if __name__ == "__main__":
    sys.exit(main())
