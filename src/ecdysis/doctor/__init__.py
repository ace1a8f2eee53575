"""`ecdysis doctor`: check what the tool needs on this machine and say how to fix each miss.

A check is a `Check(name, status, detail, fix)`: `ok`, `info` (optional, absent), `warn` (works, with less:
e.g. no bubblewrap means in-process isolation only) or `fail` (the tool cannot work: the llama.cpp build
uses instructions this CPU/OS cannot run, or dies on a long prompt). Every `warn` and `fail` carries a fix.
`run_checks` runs them all; `exit_code` is 1 when any check failed, else 0 (warnings do not fail setup).

Modules: `check` (the `Check` record), `llama` (the build's CPU features vs. this CPU, the long-prompt probe run
in a subprocess), `probe` (that subprocess), `system` (bubblewrap, user and nested namespaces, pids cgroup, models,
data, optional extras).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from . import llama, system
from .check import Check, Status

__all__ = ["Check", "Status", "exit_code", "llama", "run_checks", "system"]


def run_checks(data_dir: Path | None = None, probe_argv: Sequence[str] | None = None,
               probe_timeout_s: float = 600.0, probe: bool = True, probe_model: str = "smollm2-135m") -> list[Check]:
    """Every check, in the order a user fixes things. The probe runs `probe_model` (a catalog name or a .gguf);
    `probe_argv` replaces the probe subprocess altogether (tests)."""
    argv = probe_argv or llama.probe_argv(probe_model)
    checks = llama.llama_checks(probe_argv=argv, timeout_s=probe_timeout_s, probe=probe)
    checks += [system.bubblewrap(), system.user_namespaces(), system.nested_namespaces(), system.pids_cgroup()]
    checks += system.models()
    checks.append(system.data(data_dir))
    checks += system.extras()
    return checks


def exit_code(checks: Sequence[Check]) -> int:
    """1 when any check failed (the tool cannot work here), else 0."""
    return 1 if any(c.status == "fail" for c in checks) else 0
