"""The OS sandbox that model-written harness code runs in (Linux; bubblewrap, Debian package `bubblewrap`).

Threat model. Harness code is written by a model and treated as hostile. Inside the sandbox it:

- sees a private, size-limited tmpfs as its working directory (`/sandbox`) and `/tmp`, the system and
  Python runtime and installed packages, the package source, and of an environment plugin's folder only
  its importable code (the plugin module and the modules and packages of that folder it imports) plus the
  files the environment declares in `sandbox_files` — all read-only. Not the plugin's data files (task
  text, gold of any split), the run store, other runs, the user's home, or any host process (a PID
  namespace with its own /proc). Paths an environment declares in `sandbox_hidden` (τ²'s task files,
  inside an installed package) are masked with an empty file. Binds survive wherever the files live,
  under /tmp too: an episode's fresh tmpfs on /tmp is laid under them, not over them;
- has no network (a network namespace: not even the host's loopback), no secrets (a cleared environment),
  no capabilities, an unprivileged uid (a user namespace), a read-only root;
- cannot exhaust memory, CPU time, disk or processes (rlimits, tmpfs sizes, a pids cgroup or
  RLIMIT_NPROC) nor outlive its timeout (`--die-with-parent`; its PID namespace dies with it);
- reaches models only through the host, which holds clients, keys, cache and accounting. Grading runs in
  the host, so gold answers never enter the sandbox;
- talks to the host over one typed channel (`protocol`, read through `framing`) that the host believes only
  about what the agent did: the host builds every other field of the record (termination, score, isolation,
  counts) itself, ends the episode as `crash` on any protocol violation and as `budget` on a model call over
  the harness's or the run's budget, and tells the sandbox nothing about its cache (partitioned by split).

An episode forked from a zygote also gets namespaces of its own (`nested`): it cannot see another
episode's files, processes or sockets, nor the zygote. A Python audit hook (sockets, subprocesses,
native libraries) is a second line, not the boundary. Where bubblewrap is missing or cannot create
namespaces, workers fall back to in-process measures and every trajectory's `isolation` says so; the
external implementer refuses to run unconfined unless `train.implementer_unconfined` is set. Not
covered: kernel exploits (use a VM for untrusted optimizers).

Modules: `confine` (bubblewrap argv, pids cgroups), `view` (what of a plugin the sandbox sees),
`workers` and `forkserver` (host side: worker processes, the zygote per harness version), `protocol` and
`framing` (the channel's messages and how they are read), `host` (one episode's channel: model calls,
budgets, timeout, failures), `ledger` (the calls served and the record built from them), and on the sandbox
side `worker`, `zygote`, `nested`.
Names are imported on first use: the sandbox worker imports this package on every episode.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .host import SandboxLimits, replay_in_sandbox, run_in_sandbox
    from .view import SandboxView

__all__ = ["SandboxLimits", "SandboxView", "replay_in_sandbox", "run_in_sandbox"]
_HOME = {"SandboxLimits": "host", "replay_in_sandbox": "host", "run_in_sandbox": "host", "SandboxView": "view"}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f".{_HOME[name]}", __name__), name)
