"""The embedded backend's build: which CPU features it uses vs. what this CPU and OS run, and the
long-prompt probe (a subprocess, so an illegal instruction kills the probe, not the caller).

A build that uses a feature this CPU lacks, or a probe that dies, is a `fail` whose fix is to rebuild:
`scripts/llama_wheel.sh` builds llama-cpp-python at a fixed CPU level (never -march=native) and caches the
wheel per level in WHEEL_CACHE; deleting that folder and running `make setup` again rebuilds it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .check import Check
from .probe import EXIT_MODEL, EXIT_NO_LLAMA, EXIT_SHORT

# llama_print_system_info names -> /proc/cpuinfo flags (x86); features without a flag here are not CPU
# instruction sets (OPENMP, REPACK, LLAMAFILE) or belong to other architectures
CPU_FLAGS = {"SSE3": "pni", "SSSE3": "ssse3", "AVX": "avx", "AVX_VNNI": "avx_vnni", "AVX2": "avx2", "F16C": "f16c",
             "FMA": "fma", "BMI2": "bmi2", "AVX512": "avx512f", "AVX512_VBMI": "avx512vbmi",
             "AVX512_VNNI": "avx512_vnni", "AVX512_BF16": "avx512_bf16", "AMX_INT8": "amx_int8",
             "AMX_TILE": "amx_tile", "AMX_BF16": "amx_bf16"}
SETUP_FIX = "make setup"


def wheel_cache() -> Path:
    """Where scripts/llama_wheel.sh keeps its wheels (same rule as the script)."""
    base = os.environ.get("ECDYSIS_WHEEL_CACHE") or str(Path(os.environ.get("XDG_CACHE_HOME")
                                                             or Path.home() / ".cache") / "ecdysis" / "wheels")
    return Path(base)


def installed_wheel() -> Path | None:
    """The wheel file the installed llama-cpp-python came from, when pip recorded one (direct_url.json)."""
    from importlib import metadata

    try:
        text = metadata.distribution("llama_cpp_python").read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return None
    url = json.loads(text).get("url", "") if text else ""
    return Path(url[7:]) if url.startswith("file://") else None


def rebuild_fix() -> str:
    """How to rebuild the embedded backend with the portable build."""
    wheel = installed_wheel()
    target = wheel.parent if wheel is not None and wheel.parent.parent == wheel_cache() else \
        wheel_cache() / "llama-cpp-python-*"
    return (f"rebuild it without -march=native: `rm -rf {target} && pip cache remove llama_cpp_python; "
            f"{SETUP_FIX}` (scripts/llama_wheel.sh builds at a fixed CPU level: x86-64-v3, no AVX-512, no AMX)")


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The flags of the first CPU in /proc/cpuinfo (what the CPU reports and the kernel enabled)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()


def build_features(system_info: str) -> set[str]:
    """Features llama_print_system_info reports as compiled in (`NAME = 1`)."""
    return {name for name, value in re.findall(r"([A-Z0-9_]+) = (\d+)", system_info) if value != "0"}


def amx_permitted() -> bool | None:
    """Whether the OS lets this process use AMX tile data (arch_prctl ARCH_REQ_XCOMP_PERM); None off x86 Linux."""
    if sys.platform != "linux" or os.uname().machine != "x86_64":
        return None
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    return libc.syscall(158, 0x1023, 18) == 0  # SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA


def feature_check(system_info: str, flags: set[str], amx_ok: bool | None) -> Check:
    """The build's instruction sets against the CPU's flags; AMX in the build is a fail where the OS refuses it
    and a warning elsewhere (it is what -march=native picks up, and that wheel faults on other machines)."""
    used = build_features(system_info)
    cpu_used = sorted(f for f in used if f in CPU_FLAGS)
    missing = [f for f in cpu_used if CPU_FLAGS[f] not in flags]
    amx = [f for f in cpu_used if f.startswith("AMX")]
    name = "llama.cpp build: CPU features"
    shown = ", ".join(cpu_used) or "none reported"
    if missing:
        return Check(name, "fail", f"the build uses {', '.join(missing)}, which this CPU/OS does not provide "
                     f"(build: {shown})", rebuild_fix())
    if amx and amx_ok is False:
        return Check(name, "fail", f"the build uses {', '.join(amx)}; the CPU reports AMX but the OS does not grant "
                     "it (long prompts die with SIGILL)", rebuild_fix())
    if amx:
        return Check(name, "warn", f"the build uses {', '.join(amx)} (a -march=native build): it runs here, but "
                     "the wheel faults on a CPU or VM without usable AMX", rebuild_fix())
    return Check(name, "ok", f"{shown}; all supported by this CPU")


AMX_OPS = ("tileloadd", "tileloaddt1", "tilestored", "ldtilecfg", "sttilecfg", "tilezero", "tdpbssd", "tdpbsud",
           "tdpbusd", "tdpbuud", "tdpbf16ps", "tdpfp16ps", "tilerelease")


def cpu_library() -> Path | None:
    """llama.cpp's CPU backend library inside the installed llama_cpp package (not imported), if there is one."""
    from importlib.util import find_spec

    spec = find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None
    found = sorted(Path(spec.submodule_search_locations[0], "lib").glob("libggml-cpu.so*"))
    return found[0] if found else None


def disassembly_counts(library: Path) -> dict[str, int] | None:
    """AMX tile instructions and instructions on AVX-512 (zmm) registers in `library`'s code (objdump -d);
    None without objdump."""
    import shutil

    exe = shutil.which("objdump")
    if exe is None:
        return None
    try:
        text = subprocess.run([exe, "-d", "--no-show-raw-insn", str(library)], capture_output=True, text=True,
                              timeout=120).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = text.splitlines()
    amx = sum(1 for line in lines if line.split("\t")[-1].split(" ")[0] in AMX_OPS)
    return {"amx": amx, "zmm": sum(1 for line in lines if "%zmm" in line)}


def code_check(library: Path | None, flags: set[str], amx_ok: bool | None) -> Check:
    """What the CPU backend's machine code uses, read from the library itself (the build flags can say less)."""
    name = "llama.cpp build: machine code"
    counts = disassembly_counts(library) if library is not None else None
    if counts is None:
        return Check(name, "info", "not read (no objdump, or no libggml-cpu in llama_cpp/lib)")
    if counts["zmm"] and "avx512f" not in flags:
        return Check(name, "fail", f"{library.name} uses AVX-512 registers ({counts['zmm']} places) and this CPU has "
                     "no AVX-512", rebuild_fix())
    if counts["amx"] and (amx_ok is False or "amx_tile" not in flags):
        return Check(name, "fail", f"{library.name} holds {counts['amx']} AMX tile instructions (tileloadd, ...) that "
                     "this CPU/OS cannot run", rebuild_fix())
    if counts["amx"]:
        return Check(name, "warn", f"{library.name} holds {counts['amx']} AMX tile instructions: a -march=native "
                     "build, which faults on a machine without usable AMX", rebuild_fix())
    return Check(name, "ok", f"{library.name}: no AMX tile instruction, "
                 + ("no AVX-512 register" if not counts["zmm"] else f"AVX-512 in {counts['zmm']} places (CPU has it)"))


@dataclass(frozen=True)
class ProbeResult:
    """How the probe subprocess ended: its exit status (negative: killed by that signal; None: timed out),
    the JSON records it printed, the end of its stderr, and its wall time."""

    returncode: int | None
    records: list[dict[str, Any]] = field(default_factory=list)
    stderr: str = ""
    seconds: float = 0.0

    def record(self, stage: str) -> dict[str, Any] | None:
        return next((r for r in self.records if r.get("stage") == stage), None)


def probe_argv(model: str = "smollm2-135m", tokens: int = 520) -> list[str]:
    return [sys.executable, "-m", "ecdysis.doctor.probe", "--model", model, "--tokens", str(tokens)]


def run_probe(argv: Sequence[str] | None = None, timeout_s: float = 600.0) -> ProbeResult:
    """Run the probe (or `argv`) in a subprocess and collect how it ended."""
    start = time.perf_counter()
    try:
        proc = subprocess.run(list(argv or probe_argv()), capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        return ProbeResult(None, stderr=err[-2000:], seconds=time.perf_counter() - start)
    records = []
    for line in proc.stdout.splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return ProbeResult(proc.returncode, records, proc.stderr[-2000:], time.perf_counter() - start)


def signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def probe_check(result: ProbeResult, timeout_s: float = 600.0) -> Check:
    """What the probe's ending means, and the fix."""
    name = "llama.cpp build: long-prompt probe"
    code, tail = result.returncode, result.stderr.strip().splitlines()[-3:]
    where = "while importing llama-cpp-python" if result.record("import") is None else "on a long prompt"
    if code == 0:
        done = result.record("done") or {}
        tokens, seconds = done.get("prompt_tokens", 0), done.get("seconds", 0.0)
        return Check(name, "ok", f"a {tokens}-token prompt ran in {seconds:.1f}s")
    if code in (-signal.SIGILL, 128 + signal.SIGILL):
        return Check(name, "fail", f"the embedded backend died with SIGILL (illegal instruction) {where}: the build "
                     "uses instructions this CPU/OS cannot run -- the AMX tile kernels of a -march=native "
                     "(GGML_NATIVE) build on a CPU that reports AMX the OS or hypervisor does not enable, or a "
                     "wheel built on a newer CPU", rebuild_fix())
    if code is None:
        return Check(name, "fail", f"the probe did not finish in {timeout_s:.0f}s", "check the machine's load, then "
                     f"`python -m ecdysis.doctor.probe`; if it hangs, {rebuild_fix()}")
    if code < 0:
        return Check(name, "fail", f"the embedded backend died with {signal_name(code)} {where}",
                     f"if memory is short, free some; else {rebuild_fix()}")
    if code == EXIT_MODEL:
        return Check(name, "warn", f"not run: {' '.join(tail) or 'no model'}",
                     "`ecdysis models pull smollm2-135m`, then `ecdysis doctor`")
    if code == EXIT_NO_LLAMA:
        return Check(name, "warn", "not run: llama-cpp-python is not installed (no embedded local models)",
                     f"`{SETUP_FIX}` (or scripts/llama_wheel.sh PIP), or use hosted models only")
    if code == EXIT_SHORT:
        return Check(name, "fail", " ".join(tail), "report this: the probe's prompt must be >= 512 tokens")
    return Check(name, "fail", f"the probe exited with status {code}: {' | '.join(tail)}",
                 f"run `{sys.executable} -m ecdysis.doctor.probe` to see the error; if it is in llama.cpp, "
                 f"{rebuild_fix()}")


def llama_checks(probe_argv: Sequence[str] | None = None, timeout_s: float = 600.0, probe: bool = True) -> list[Check]:
    """The build's features (from the probe's first record) and the probe itself."""
    if not probe:
        return [Check("llama.cpp build", "info", "not probed (--no-probe)")]
    result = run_probe(probe_argv, timeout_s)
    checks = []
    imported = result.record("import")
    if imported is not None:
        flags = cpu_flags()
        amx_ok = amx_permitted() if {"amx_tile", "amx_int8"} & flags else None
        wheel = installed_wheel()
        checks.append(Check("llama.cpp build", "ok", f"llama-cpp-python {imported.get('version')}"
                            + (f" from {wheel}" if wheel else " (not from scripts/llama_wheel.sh)")))
        checks.append(feature_check(str(imported.get("system_info", "")), flags, amx_ok))
        checks.append(code_check(cpu_library(), flags, amx_ok))
    checks.append(probe_check(result, timeout_s))
    return checks
