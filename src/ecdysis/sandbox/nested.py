"""Per-episode namespaces inside the sandbox, for episodes forked from a zygote (sandbox side, Linux only).

The zygote runs under the worker's bubblewrap confinement; each episode it forks must not see another
episode. `enter_namespaces` (in the forked child) creates a user namespace, nested in bubblewrap's, that
owns fresh mount, PID, network, IPC and UTS namespaces; the next child is PID 1 of its own PID namespace
and calls `seal_episode`: fresh private tmpfs mounts for every writable place (/sandbox, /tmp, /dev/shm),
a /proc holding only /proc/self, then every capability dropped and no_new_privs set. What an episode
writes, listens on or runs is invisible to every other episode; mounts inherited from the parent
namespace are locked by the kernel, so the covered ones cannot be uncovered.
"""

from __future__ import annotations

import ctypes
import os
import signal

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_MOVE, MS_REC = 1, 2, 4, 8, 32, 4096, 8192, 16384
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 24, 38
_CAP_VERSION_3 = 0x20080522
WRITABLE = ("/sandbox", "/tmp", "/dev/shm")
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
            _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, f"size={TMPFS_BYTES},mode=0777")
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


def _drop_capabilities() -> None:
    for cap in range(64):
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break  # past the last capability this kernel knows
    header, data = _CapHeader(_CAP_VERSION_3, 0), (_CapData * 2)()
    _check(_libc.capset(ctypes.byref(header), data), "capset")
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
