"""Checks of the machine around the model: the sandbox's OS features, models, task data, optional extras.

Each function returns `Check`s and never raises; the sandbox checks run the same kind of bubblewrap
command the sandbox does (`--unshare-all`, an unprivileged uid), so a pass here means the sandbox works.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

from .check import Check

BWRAP_FIX = "install bubblewrap: `sudo apt-get install bubblewrap` (Debian/Ubuntu; `dnf install bubblewrap` on Fedora)"
BWRAP_BASE = ("--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev",
              "--tmpfs", "/tmp", "--uid", "65534", "--gid", "65534")
# in the sandbox: a user namespace owning fresh mount/PID/net/IPC/UTS namespaces, a child that mounts a tmpfs
NESTED = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
uid, gid = os.getuid(), os.getgid()
if libc.unshare(0x10000000 | 0x00020000 | 0x20000000 | 0x40000000 | 0x08000000 | 0x04000000) != 0:
    raise SystemExit("unshare: " + os.strerror(ctypes.get_errno()))
for name, value in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
    with open(f"/proc/self/{name}", "w") as handle:
        handle.write(value)
pid = os.fork()
if pid == 0:
    ok = libc.mount(b"tmpfs", b"/tmp", b"tmpfs", 6, b"size=1048576") == 0
    os._exit(0 if ok else 3)
raise SystemExit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""


def _sysctl(name: str) -> str | None:
    with contextlib.suppress(OSError):
        return Path("/proc/sys", *name.split(".")).read_text().strip()
    return None


def userns_fix() -> str:
    """The setting that keeps unprivileged user namespaces off here, if one is known, else the usual ones."""
    if _sysctl("kernel.unprivileged_userns_clone") == "0":
        return "`sudo sysctl -w kernel.unprivileged_userns_clone=1`"
    if _sysctl("kernel.apparmor_restrict_unprivileged_userns") == "1":
        return ("`sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0` (Ubuntu 24.04+), or an AppArmor "
                "profile for bwrap")
    if _sysctl("user.max_user_namespaces") == "0":
        return "`sudo sysctl -w user.max_user_namespaces=15000`"
    return ("allow user namespaces: in a container run it with `--security-opt seccomp=unconfined` (Docker) or "
            "privileges to create namespaces; on a host check kernel.unprivileged_userns_clone and "
            "user.max_user_namespaces")


def _rebind_under_tmp() -> list[str]:
    """The interpreter's folders that BWRAP_BASE's fresh /tmp would hide (a checkout or venv under /tmp)."""
    folders = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, os.path.dirname(sys.executable))}
    out: list[str] = []
    for folder in sorted(f for f in folders if f == "/tmp" or f.startswith("/tmp/")):
        out += ["--ro-bind", folder, folder]
    return out


def _bwrap(args: list[str], timeout_s: float = 30.0) -> subprocess.CompletedProcess[str] | str:
    exe = shutil.which("bwrap")
    if exe is None:
        return "bwrap not found"
    try:
        return subprocess.run([exe, *BWRAP_BASE, *_rebind_under_tmp(), *args], capture_output=True, text=True,
                              timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)


def bubblewrap() -> Check:
    exe = shutil.which("bwrap")
    if exe is None:
        return Check("bubblewrap", "warn", "bwrap is not on PATH: episodes run with in-process measures only "
                     "(no OS boundary around model-written harness code)", BWRAP_FIX)
    return Check("bubblewrap", "ok", exe)


def user_namespaces() -> Check:
    name = "user namespaces (sandbox)"
    out = _bwrap(["true"])
    if isinstance(out, str):
        return Check(name, "warn", f"not checked: {out}", BWRAP_FIX)
    if out.returncode != 0:
        return Check(name, "warn", f"bwrap cannot create namespaces here: {out.stderr.strip()[-300:]}", userns_fix())
    return Check(name, "ok", "bwrap creates user, PID, network, mount and IPC namespaces")


def nested_namespaces() -> Check:
    name = "nested namespaces (fork server)"
    fallback = "without them each episode starts a fresh worker process (same isolation, ~160 ms more per episode)"
    out = _bwrap([sys.executable, "-c", NESTED])
    if isinstance(out, str):
        return Check(name, "warn", f"not checked: {out}; {fallback}", BWRAP_FIX)
    if out.returncode != 0:
        why = (out.stderr.strip() or f"exit status {out.returncode}").splitlines()[-1][-300:]
        return Check(name, "warn", f"namespaces nested in bubblewrap's are refused ({why}); {fallback}",
                     userns_fix() + "; nesting also needs user.max_user_namespaces above the run's concurrency")
    return Check(name, "ok", "an episode can enter fresh namespaces inside the sandbox")


def pids_cgroup() -> Check:
    from ..sandbox.confine import pids_cgroup_root  # the one the sandbox uses

    root = pids_cgroup_root()
    if root is None:
        return Check("pids cgroup", "warn", "no cgroup this user may create pids-limited children in: processes are "
                     "bounded by RLIMIT_NPROC only (which root ignores)",
                     "run under a delegated cgroup, e.g. `systemd-run --user --scope -p Delegate=yes make test`, "
                     "or as root with the cgroup v1 pids controller mounted")
    return Check("pids cgroup", "ok", str(root))


def models() -> list[Check]:
    """Each catalog model: present and matching its pinned sha256 (checked once, then remembered by a stamp)."""
    from ..models.local_models import CATALOG, DEFAULT_LOCAL_MODEL, ChecksumError, models_dir, resolve_verified

    needed = {"smollm2-135m": "make test and the setup probe", DEFAULT_LOCAL_MODEL: "make run (the default model)"}
    out = []
    for spec in CATALOG.values():
        name = f"model {spec.name}"
        path = models_dir() / spec.filename
        pull = f"`ecdysis models pull {spec.name}`"
        if not path.exists():
            why = needed.get(spec.name)
            out.append(Check(name, "warn" if why else "info", f"not downloaded ({path})" + (f"; {why} needs it"
                             if why else ""), pull))
            continue
        try:
            resolve_verified(spec.name)
        except ChecksumError:
            out.append(Check(name, "warn", f"{path} does not match its pinned sha256 {spec.sha256[:12]}...",
                             f"`rm {path}` and {pull}"))
            continue
        except Exception as exc:  # noqa: BLE001 - unreadable file, permissions
            out.append(Check(name, "warn", f"{path}: {exc}", f"`rm {path}` and {pull}"))
            continue
        out.append(Check(name, "ok", f"{path} (sha256 {spec.sha256[:12]}... verified)"))
    return out


DATA_FILES = ("gsm8k/train.jsonl", "gsm8k/test.jsonl", "dbbench/dev.jsonl", "dbbench/standard.jsonl")


def data(data_dir: Path | None = None) -> Check:
    """Task data for the built-in benchmarks in --data-dir, $ECDYSIS_DATA_DIR or the download cache."""
    places = [p for p in (data_dir, os.environ.get("ECDYSIS_DATA_DIR")) if p]
    places.append(Path.home() / ".cache" / "ecdysis" / "data")
    for base in places:
        found = [f for f in DATA_FILES if (Path(base) / f).exists()]
        if found:
            missing = [f for f in DATA_FILES if f not in found]
            status = "warn" if missing else "ok"
            return Check("data dir", status, f"{base}: {len(found)} of {len(DATA_FILES)} task files"
                         + (f" (missing {', '.join(missing)})" if missing else ""),
                         "put the missing files there, or pass --data-dir" if missing else "")
    looked = ", ".join(str(p) for p in places)
    return Check("data dir", "warn", f"no task data in {looked} (GSM8K downloads on first use if the network allows)",
                 "pass --data-dir DIR (a folder holding gsm8k/ and dbbench/) or set ECDYSIS_DATA_DIR")


EXTRAS = (("tau2", "tau2", "the tau2-* environments (τ²-bench)"), ("ray", "ray", "--executor ray"),
          ("gepa", "gepa", "the gepa arm of compare"))


def extras() -> list[Check]:
    out = []
    for extra, module, what in EXTRAS:
        present = find_spec(module) is not None
        state = "installed" if present else "not installed"
        out.append(Check(f"extra {extra}", "ok" if present else "info", f"{what}: {state}",
                         "" if present else f"`pip install -e '.[{extra}]'`"))
    return out
