"""Bubblewrap confinement of sandbox workers and tools, and pids cgroups (the threat model: `ecdysis.sandbox`).

`confine_argv` wraps a worker (or zygote) command: namespaces, read-only binds of the runtime and of the
paths given, hidden paths masked with an empty file, a private tmpfs home and /tmp, a cleared environment.
`confine_tool_argv` does the same for the external implementer, with one writable folder. Both return None
where bwrap is missing or cannot create namespaces (the worker then falls back to in-process measures).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import uuid
from pathlib import Path

SANDBOX_HOME = "/sandbox"
NOBODY = "65534"
TOOL_WORKDIR = "/harness"  # where an external tool sees its writable copy (not a host path: binds stay visible)
SYSTEM_DIRS = ("/usr", "/bin", "/lib", "/lib64", "/lib32", "/etc/alternatives", "/etc/ld.so.cache")


@functools.cache
def bwrap_path() -> str | None:
    """The bwrap executable if it exists and can create the namespaces we need here, else None."""
    exe = shutil.which("bwrap")
    if exe is None:
        return None
    try:
        probe = subprocess.run([exe, "--unshare-all", "--ro-bind", "/", "/", "--uid", NOBODY, "true"],
                               capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return exe if probe.returncode == 0 else None


TASK_MARGIN = 64  # processes and threads harness code may add (RLIMIT_NPROC: a fork bomb stops there)


_COUNTED: list[float] = [0.0, 0.0]  # (when, count) of the latest scan


def uid_tasks(max_age_s: float = 1.0) -> int:
    """Processes and threads this user runs (RLIMIT_NPROC counts them all, host-wide), as counted at most
    `max_age_s` ago: a scan of /proc costs a millisecond, which every episode's start would otherwise pay."""
    when, counted = _COUNTED
    if time.monotonic() - when < max_age_s:
        return int(counted)
    uid, count = os.getuid(), 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    count += len(os.listdir(f"/proc/{entry.name}/task"))
            except OSError:
                continue
    _COUNTED[:] = [time.monotonic(), float(count)]
    return count


@functools.cache
def pids_cgroup_root() -> Path | None:
    """A cgroup folder this process may create pids-limited children in (the v1 `pids` hierarchy, or a v2
    cgroup that delegates `pids`), else None (then RLIMIT_NPROC is the bound, which root ignores)."""
    candidates = [Path("/sys/fs/cgroup/pids")]
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                own = Path("/sys/fs/cgroup") / line[3:].lstrip("/")
                if "pids" in (own / "cgroup.subtree_control").read_text().split():
                    candidates.append(own)
    for root in candidates:
        probe = root / f"ecdysis-probe-{os.getpid()}"
        try:
            probe.mkdir()
            ok = (probe / "pids.max").exists()
            probe.rmdir()
        except OSError:
            continue
        if ok:
            _remove_stale(root)
            return root
    return None


def _remove_stale(root: Path) -> None:
    """Remove the empty cgroups of ecdysis processes that are gone (killed before they could clean up)."""
    for path in root.glob("ecdysis-*-*"):
        owner = path.name.split("-")[1]
        if not owner.isdigit() or int(owner) == os.getpid():
            continue
        try:
            os.kill(int(owner), 0)
        except ProcessLookupError:
            with contextlib.suppress(OSError):
                path.rmdir()  # fails (and stays) while a process is still inside
        except PermissionError:
            continue


class PidsCgroup:
    """A pids-limited cgroup for one worker: every process and thread the worker (and bwrap) starts counts,
    and a fork beyond `limit` fails. `enter` runs in the child before exec."""

    def __init__(self, root: Path, limit: int) -> None:
        self.path = root / f"ecdysis-{os.getpid()}-{uuid.uuid4().hex[:10]}"
        self.path.mkdir()
        (self.path / "pids.max").write_text(str(limit))

    def enter(self) -> None:
        self.add(os.getpid())

    def add(self, pid: int) -> None:
        """Move process `pid` (and so everything it starts from now on) into this cgroup."""
        (self.path / "cgroup.procs").write_text(str(pid))

    def remove(self) -> None:
        """Remove once empty (the worker's processes are gone); retried briefly while they exit."""
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.02)

    def release(self) -> None:
        """Remove later, by the next `sweep_cgroups` (an rmdir takes milliseconds: not on an episode's path)."""
        _LEFT_OVER.append(self)


_LEFT_OVER: list[PidsCgroup] = []  # released, not yet removed


def _sweep_at_exit() -> None:
    """At exit, give the processes of released cgroups a moment to go, then remove what emptied (what is
    left is removed by the next ecdysis process, see `_remove_stale`)."""
    for _ in range(25):
        sweep_cgroups()
        if not _LEFT_OVER:
            return
        time.sleep(0.02)


atexit.register(_sweep_at_exit)


def sweep_cgroups() -> None:
    """Remove the released cgroups that have emptied (the rest stay for the next sweep)."""
    for cgroup in list(_LEFT_OVER):
        try:
            cgroup.path.rmdir()
        except FileNotFoundError:
            pass
        except OSError:
            continue  # still busy
        with contextlib.suppress(ValueError):
            _LEFT_OVER.remove(cgroup)


def pids_cgroup(limit: int = TASK_MARGIN) -> PidsCgroup | None:
    root = pids_cgroup_root()
    if root is None:
        return None
    sweep_cgroups()
    try:
        return PidsCgroup(root, limit)
    except OSError:
        return None


@functools.cache
def empty_file() -> str:
    """An empty, world-readable regular file to mask hidden files with (device nodes like /dev/null
    cannot be opened through a bind in a user namespace)."""
    fd, path = tempfile.mkstemp(prefix="ecdysis-masked-")
    os.close(fd)
    os.chmod(path, 0o444)
    return path


def runtime_paths(src_root: str) -> list[str]:
    """Read-only paths the worker's Python needs: the interpreter's prefix, the venv, the package source."""
    paths = {sys.base_prefix, sys.prefix, src_root, sysconfig.get_paths()["purelib"],
             str(Path(sys.executable).resolve().parent)}
    return sorted(p for p in paths if p and Path(p).exists())


def _bwrap_base(exe: str, tmp_mb: int, network: bool = False) -> list[str]:
    """The namespaces, identity and private tmpfs mounts every confined process gets."""
    size = str(tmp_mb * 1024 * 1024)
    return [exe, "--unshare-all", *(["--share-net"] if network else []), "--die-with-parent", "--new-session",
            "--cap-drop", "ALL", "--uid", NOBODY, "--gid", NOBODY, "--proc", "/proc", "--dev", "/dev",
            "--size", size, "--tmpfs", "/tmp", "--size", size, "--tmpfs", SANDBOX_HOME, "--clearenv"]


def _read_only(paths: list[str]) -> list[str]:
    """Read-only binds of the paths that exist, each once."""
    return [arg for path in dict.fromkeys(paths) if os.path.exists(path) for arg in ("--ro-bind", path, path)]


def confine_argv(command: list[str], env: dict[str, str], src_root: str, read_only: list[str],
                 hidden: list[str], tmp_mb: int = 256) -> list[str] | None:
    """`command` wrapped in bwrap with the threat model above, or None if bwrap is unavailable."""
    exe = bwrap_path()
    if exe is None:
        return None
    argv = [*_bwrap_base(exe, tmp_mb), "--hostname", "sandbox", "--chdir", SANDBOX_HOME,
            *_read_only([*SYSTEM_DIRS, *runtime_paths(src_root), *read_only])]
    for path in hidden:
        if os.path.exists(path):
            argv += ["--ro-bind", empty_file(), path]
    argv += ["--remount-ro", "/"]  # the sandbox's own root (mount points) is read-only too
    for key, value in env.items():
        argv += ["--setenv", key, SANDBOX_HOME if key in ("HOME", "TMPDIR") else value]
    return [*argv, "--", *command]


def confine_tool_argv(command: list[str], workdir: str, env: dict[str, str], network: bool,
                      tmp_mb: int = 512) -> list[str] | None:
    """An external tool (the implementer's coding agent) confined like a worker, or None without bwrap.

    It sees the system and Python runtime read-only, its own executable's folder read-only, and exactly one
    writable folder, `workdir` (a copy of the harness), mounted at /harness; a private tmpfs home and /tmp; a
    cleared environment plus `env`; no network unless `network` (for agents that call a hosted model API:
    then DNS and TLS configuration are visible too). Nothing else of the host: not the run store, the task
    data, other runs, the user's home or keys not passed in `env`."""
    exe = bwrap_path()
    if exe is None:
        return None
    tool_dir = shutil.which(command[0])
    readable = [*SYSTEM_DIRS, *runtime_paths(str(Path(__file__).resolve().parents[2])),
                *([str(Path(tool_dir).resolve().parent)] if tool_dir else []),
                *(("/etc/resolv.conf", "/etc/hosts", "/etc/ssl", "/etc/ca-certificates") if network else ())]
    argv = [*_bwrap_base(exe, tmp_mb, network), *_read_only(readable),
            "--bind", workdir, TOOL_WORKDIR, "--chdir", TOOL_WORKDIR]
    for key, value in {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": SANDBOX_HOME, "TMPDIR": "/tmp",
                       "LANG": "C.UTF-8", **env}.items():
        argv += ["--setenv", key, value]
    return [*argv, "--", *command]
