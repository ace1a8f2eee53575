"""Per-episode namespaces inside the sandbox, for episodes forked from a zygote (sandbox side, Linux only).

The zygote runs under the worker's bubblewrap confinement; each episode it forks must not see another
episode. `enter_namespaces` (in the forked child) creates a user namespace, nested in bubblewrap's, that
owns fresh mount, PID, network, IPC and UTS namespaces; the next child is PID 1 of its own PID namespace
and calls `seal_episode`: fresh private tmpfs mounts for every writable place (/sandbox, /tmp, /dev/shm),
/dev itself read-only (bubblewrap's /dev is the zygote's, shared by its episodes: nothing written there may
reach the next episode), a /proc holding only /proc/self, then every capability dropped and no_new_privs
set. What an episode writes, listens on or runs is invisible to every other episode; mounts inherited from
the parent namespace are locked by the kernel, so the covered ones cannot be uncovered.

`run_sealed(body)` does both steps for a zygote's forked child; `works_here()` probes, once, whether the kernel
and bubblewrap allow it (if not, the host starts a fresh worker per episode instead).

A read-only bind below a writable place (the project, its venv or a plugin in a folder under /tmp) is
bound again on top of the fresh tmpfs, read-only, so the episode sees exactly what the zygote saw there.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import stat
import traceback
from collections.abc import Callable

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_MOVE, MS_REC = 1, 2, 4, 8, 32, 4096, 8192, 16384
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 24, 38
_CAP_VERSION_3 = 0x20080522
WRITABLE = ("/sandbox", "/tmp", "/dev/shm")  # each episode gets a fresh tmpfs here
SHARED_READ_ONLY = ("/dev",)  # bubblewrap's writable /dev of the zygote: read-only for its episodes (devices work)
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
_KEPT_FLAGS = ((os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV), (os.ST_NOEXEC, MS_NOEXEC),
               (os.ST_NOATIME, MS_NOATIME), (os.ST_NODIRATIME, MS_NODIRATIME), (os.ST_RELATIME, MS_RELATIME))
TMPFS_BYTES = 256 * 1024 * 1024

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(_libc.mount(source and source.encode(), target.encode(), fstype and fstype.encode(), flags,
                       data and data.encode()), f"mount {target}")


def enter_namespaces() -> None:
    """Move the calling (single-threaded) process into fresh namespaces; its next child is PID 1."""
    uid, gid = os.getuid(), os.getgid()
    _check(_libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS),
           "unshare")
    for name, value in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as handle:
            handle.write(value)


def seal_episode(workdir: str = "/sandbox") -> None:
    """In PID 1 of the new namespaces: die with the parent, private mounts, no privileges; cwd = `workdir`."""
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")
    own = os.readlink("/proc/self")  # this process's pid in the zygote's /proc
    for path in WRITABLE:
        if os.path.isdir(path):
            kept = _binds_below(path)
            _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, f"size={TMPFS_BYTES},mode=0777")
            _bind_again(kept)
    for path in SHARED_READ_ONLY:  # the zygote's own tmpfs: what one episode wrote there, the next would read
        if path in _mount_points():
            _remount_read_only(path)
    staging = "/tmp/.proc-self"
    os.mkdir(staging)
    _mount(f"/proc/{own}", staging, None, MS_BIND | MS_REC)
    _mount("tmpfs", "/proc", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4096,mode=0555")
    os.mkdir("/proc/self")
    _mount(staging, "/proc/self", None, MS_MOVE)
    os.rmdir(staging)
    _mount(None, "/proc", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.chdir(workdir)  # the old cwd is the zygote's directory, not this episode's fresh one
    _drop_capabilities()


def run_sealed(body: Callable[[], int]) -> int:
    """Enter fresh namespaces and run `body` in a child that is PID 1 of them and sealed; its exit status.
    A failure in the child is written to its stderr (fd 2)."""
    enter_namespaces()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            seal_episode()
            code = body()
        except BaseException:  # noqa: BLE001 - reported on stderr, ends the child
            with contextlib.suppress(OSError):
                os.write(2, traceback.format_exc().encode())
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def works_here() -> bool:
    """Whether a child can enter and seal fresh namespaces here (kernel and bubblewrap allow nesting)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = run_sealed(lambda: 0)
        except BaseException:  # noqa: BLE001, S110 - refused: the host starts fresh workers instead
            pass
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def _mount_points() -> list[str]:
    """Mount points of this mount namespace (mountinfo's fifth field, octal escapes decoded)."""
    with open("/proc/self/mountinfo", "rb") as handle:
        fields = [line.split()[4] for line in handle if line.strip()]
    return [re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]), f).decode() for f in fields]


def _binds_below(folder: str) -> list[tuple[str, int]]:
    """The outermost mounts strictly below `folder`, each with an O_PATH descriptor that keeps it reachable
    once `folder` is covered (their own submounts come along with them: the binds are recursive)."""
    prefix = folder.rstrip("/") + "/"
    below = sorted({p for p in _mount_points() if p.startswith(prefix)})
    outermost = [p for p in below if not any(p.startswith(q.rstrip("/") + "/") for q in below if q != p)]
    return [(p, os.open(p, os.O_PATH | os.O_NOFOLLOW)) for p in outermost]


def _bind_again(kept: list[tuple[str, int]]) -> None:
    """Bind each kept mount at its old path on top of the fresh tmpfs, read-only (verified, else raise)."""
    for path, fd in kept:
        try:
            is_dir = stat.S_ISDIR(os.fstat(fd).st_mode)
            os.makedirs(path if is_dir else os.path.dirname(path), exist_ok=True)
            if not is_dir:
                os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o444))
            _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
            _remount_read_only(path)
        finally:
            os.close(fd)


def _remount_read_only(path: str) -> None:
    """Make the mount at `path` read-only in this mount namespace, keeping its other (locked) flags; raise
    if it stays writable."""
    if not os.statvfs(path).f_flag & os.ST_RDONLY:
        kept_flags = sum(flag for st, flag in _KEPT_FLAGS if os.statvfs(path).f_flag & st)
        _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | kept_flags)
    if not os.statvfs(path).f_flag & os.ST_RDONLY:
        raise OSError(f"{path} is writable after remounting it read-only")


def _drop_capabilities() -> None:
    for cap in range(64):
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break  # past the last capability this kernel knows
    header, data = _CapHeader(_CAP_VERSION_3, 0), (_CapData * 2)()
    _check(_libc.capset(ctypes.byref(header), data), "capset")
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
