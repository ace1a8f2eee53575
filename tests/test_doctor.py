"""`ecdysis doctor` and the long-prompt probe: every failing check says what to do (failures injected)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

from ecdysis.doctor import Check, exit_code, llama, run_checks, system
from ecdysis.models import local_models

SIGILL_SELF = "import os, signal; os.kill(os.getpid(), signal.SIGILL)"
IMPORTED = json.dumps({"stage": "import", "version": "0.3.36", "system_info": "CPU : AVX2 = 1 | AMX_INT8 = 1 |"})


def doctor_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ecdysis", "doctor", *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})})


def test_a_probe_killed_by_sigill_fails_with_the_amx_explanation_and_the_rebuild() -> None:
    result = llama.run_probe([sys.executable, "-c", SIGILL_SELF])
    assert result.returncode == -4
    check = llama.probe_check(result)
    assert check.status == "fail"
    assert "SIGILL" in check.detail and "AMX" in check.detail and "-march=native" in check.detail
    assert "while importing" in check.detail  # it died before printing its first record
    assert "rm -rf" in check.fix and "make setup" in check.fix and "llama_wheel.sh" in check.fix
    late = llama.run_probe([sys.executable, "-c", f"print({IMPORTED!r}, flush=True); {SIGILL_SELF}"])
    assert "on a long prompt" in llama.probe_check(late).detail
    assert exit_code(llama.llama_checks(probe_argv=[sys.executable, "-c", SIGILL_SELF])) == 1  # setup fails


def test_other_probe_endings_each_say_what_to_do() -> None:
    segv = llama.probe_check(llama.run_probe([sys.executable, "-c", SIGILL_SELF.replace("SIGILL", "SIGSEGV")]))
    assert segv.status == "fail" and "SIGSEGV" in segv.detail and "make setup" in segv.fix
    slow = llama.run_probe([sys.executable, "-c", "import time; time.sleep(30)"], timeout_s=0.5)
    assert slow.returncode is None
    assert "did not finish" in llama.probe_check(slow, 0.5).detail
    missing = llama.probe_check(llama.run_probe([sys.executable, "-c", "import sys; print('local model x is not "
                                                 "downloaded', file=sys.stderr); sys.exit(5)"]))
    assert missing.status == "warn" and "ecdysis models pull smollm2-135m" in missing.fix
    crashed = llama.probe_check(llama.run_probe([sys.executable, "-c", "raise RuntimeError('ggml says no')"]))
    assert crashed.status == "fail" and "ggml says no" in crashed.detail and "ecdysis.doctor.probe" in crashed.fix
    ok = llama.probe_check(llama.ProbeResult(0, [{"stage": "done", "prompt_tokens": 700, "seconds": 2.0}]))
    assert ok.status == "ok" and "700-token" in ok.detail


def test_build_features_are_checked_against_the_cpu() -> None:
    flags = llama.cpu_flags("processor : 0\nflags : fpu sse pni ssse3 avx avx2 fma f16c bmi2\n")
    assert {"avx2", "fma", "pni"} <= flags and "avx512f" not in flags
    portable = "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | OPENMP = 1 |"
    assert llama.feature_check(portable, flags, None).status == "ok"
    native = portable + " AVX512 = 1 | AVX512_VNNI = 1 |"
    check = llama.feature_check(native, flags, None)
    assert check.status == "fail" and "AVX512, AVX512_VNNI" in check.detail and "rm -rf" in check.fix
    amx = portable + " AMX_INT8 = 1 |"
    amx_flags = flags | {"amx_int8", "amx_tile"}
    refused = llama.feature_check(amx, amx_flags, amx_ok=False)
    assert refused.status == "fail" and "does not grant" in refused.detail
    granted = llama.feature_check(amx, amx_flags, amx_ok=True)
    assert granted.status == "warn" and "-march=native" in granted.detail and "make setup" in granted.fix
    assert llama.build_features("CPU : AVX = 1 | AVX2 = 0 |") == {"AVX"}


def test_without_bwrap_on_path_the_sandbox_checks_warn_with_the_install_command(tmp_path: Path) -> None:
    out = doctor_cli("--no-probe", "--json", env={"PATH": str(tmp_path)})
    assert out.returncode == 0, out.stderr  # warnings do not fail
    checks = {c["name"]: c for c in json.loads(out.stdout)["checks"]}
    for name in ("bubblewrap", "user namespaces (sandbox)", "nested namespaces (fork server)"):
        assert checks[name]["status"] == "warn", checks[name]
        assert "apt-get install bubblewrap" in checks[name]["fix"]
    assert "in-process measures" in checks["bubblewrap"]["detail"]


def test_missing_and_corrupt_models_say_how_to_pull_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ECDYSIS_MODELS_DIR", str(tmp_path))
    spec = local_models.CATALOG["qwen2.5-coder-0.5b"]
    (tmp_path / spec.filename).write_bytes(b"not a gguf")
    checks = {c.name: c for c in system.models()}
    smol = checks["model smollm2-135m"]
    assert smol.status == "warn" and "not downloaded" in smol.detail and "make test" in smol.detail
    assert smol.fix == "`ecdysis models pull smollm2-135m`"
    bad = checks["model qwen2.5-coder-0.5b"]
    assert bad.status == "warn" and "sha256" in bad.detail
    assert f"rm {tmp_path / spec.filename}" in bad.fix and "ecdysis models pull qwen2.5-coder-0.5b" in bad.fix
    text = doctor_cli("--no-probe", env={"ECDYSIS_MODELS_DIR": str(tmp_path)}).stdout
    assert "warn model smollm2-135m" in text and "fix: `ecdysis models pull smollm2-135m`" in text


def test_data_dir_check(tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ECDYSIS_DATA_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no download cache either
    empty = system.data(tmp_path / "nothing")
    assert empty.status == "warn" and "--data-dir" in empty.fix
    assert system.data(data_dir).status == "ok"
    (tmp_path / "half" / "gsm8k").mkdir(parents=True)
    (tmp_path / "half" / "gsm8k" / "train.jsonl").write_text("")
    half = system.data(tmp_path / "half")
    assert half.status == "warn" and "dbbench/dev.jsonl" in half.detail


def test_every_warning_and_failure_carries_a_fix() -> None:
    checks = run_checks(probe_argv=[sys.executable, "-c", SIGILL_SELF])
    assert exit_code(checks) == 1
    assert all(c.fix for c in checks if c.status in ("warn", "fail")), [c for c in checks if not c.fix]
    assert exit_code([Check("x", "warn", "d", "f"), Check("y", "info", "d")]) == 0
    extras = {c.name: c for c in system.extras()}
    assert set(extras) == {"extra tau2", "extra ray", "extra gepa"}
    assert all(c.status == "ok" or "pip install -e '.[" in c.fix for c in extras.values())


@pytest.mark.slow
def test_the_real_probe_runs_a_long_prompt_through_the_embedded_backend(smollm_path: Path) -> None:
    if find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python not installed")
    result = llama.run_probe(llama.probe_argv("smollm2-135m", 520))
    check = llama.probe_check(result)
    assert check.status == "ok", (check, result.stderr)
    done = result.record("done")
    assert done is not None and done["prompt_tokens"] >= 520
    imported = result.record("import")
    assert imported is not None
    features = llama.feature_check(imported["system_info"], llama.cpu_flags(), None)
    assert features.status == "ok", features  # nothing this CPU lacks, no AMX
    built = llama.build_features(imported["system_info"])
    assert not {f for f in built if f.startswith("AMX")}  # never AMX; AVX-512 only when asked (below), on a CPU
    assert not {f for f in built if f.startswith("AVX512")} or "avx512f" in llama.cpu_flags()  # that has it


def test_the_wheel_script_builds_avx512_only_when_asked_on_a_cpu_that_has_it() -> None:
    script = Path(__file__).resolve().parents[1] / "scripts" / "llama_wheel.sh"

    def level(asked: str | None) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k != "ECDYSIS_LLAMA_LEVEL"}
        return subprocess.run([str(script), "--level"], capture_output=True, text=True, timeout=60,
                              env=env | ({"ECDYSIS_LLAMA_LEVEL": asked} if asked else {}))

    flags = llama.cpu_flags()
    machine = os.uname().machine
    portable = f"{machine}-native" if machine != "x86_64" else \
        "x86-64-v3" if {"avx2", "fma", "f16c", "bmi2"} <= flags else "x86-64"
    assert level(None).stdout.strip() == portable  # the default never builds AVX-512, whatever the CPU has
    asked = level("x86-64-v4-vnni")
    needed = {"avx2", "fma", "f16c", "bmi2", "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl",
              "avx512_vnni", "avx512vbmi"}
    if machine == "x86_64" and needed <= flags:
        assert asked.returncode == 0 and asked.stdout.strip() == "x86-64-v4-vnni"
    else:
        assert asked.returncode == 2 and "lacks" in asked.stderr and asked.stdout == ""
    unknown = level("x86-64-v9")
    assert unknown.returncode == 2 and "not a level this script builds" in unknown.stderr


AMX_SOURCE = """
void tiles(void) { __asm__ volatile ("tilerelease"); }
void wide(void) { __asm__ volatile ("vpxord %zmm0, %zmm0, %zmm0"); }
"""


@pytest.mark.skipif(not (shutil.which("cc") and shutil.which("objdump")), reason="needs cc and objdump")
def test_the_machine_code_check_finds_amx_and_avx512_in_a_library(tmp_path: Path) -> None:
    source = tmp_path / "k.c"
    source.write_text(AMX_SOURCE)
    library = tmp_path / "libggml-cpu.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    assert llama.disassembly_counts(library) == {"amx": 1, "zmm": 1}
    avx2_only = {"avx", "avx2", "fma"}
    wide = llama.code_check(library, avx2_only, None)
    assert wide.status == "fail" and "AVX-512" in wide.detail and "rm -rf" in wide.fix
    tiles = llama.code_check(library, avx2_only | {"avx512f", "amx_tile"}, amx_ok=False)
    assert tiles.status == "fail" and "1 AMX tile instructions" in tiles.detail
    assert llama.code_check(library, avx2_only | {"avx512f", "amx_tile"}, amx_ok=True).status == "warn"
    installed = llama.cpu_library()
    if installed is not None:  # the portable build itself: neither
        assert llama.code_check(installed, llama.cpu_flags(), None).status == "ok"


def test_doctor_exits_1_with_the_fix_when_the_probe_fails(tmp_path: Path) -> None:
    if find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python not installed")
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF but not really")
    out = doctor_cli("--probe-model", str(broken), "--json")
    assert out.returncode == 1, out.stdout + out.stderr  # what `make setup` stops on
    report = json.loads(out.stdout)
    probe = next(c for c in report["checks"] if c["name"] == "llama.cpp build: long-prompt probe")
    assert not report["ok"] and probe["status"] == "fail" and "exited with status 1" in probe["detail"]
    assert "ecdysis.doctor.probe" in probe["fix"] and "make setup" in probe["fix"]
    text = doctor_cli("--probe-model", str(broken)).stdout
    assert "FAIL llama.cpp build: long-prompt probe" in text and "doctor: 1 check(s) failed" in text


def test_doctor_sandbox_checks_keep_an_interpreter_under_tmp_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    from ecdysis.doctor import system

    monkeypatch.setattr(system.sys, "prefix", "/tmp/clone/.venv")
    monkeypatch.setattr(system.sys, "base_prefix", "/opt/python")
    monkeypatch.setattr(system.sys, "executable", "/tmp/clone/.venv/bin/python3")
    binds = system._rebind_under_tmp()
    assert binds[binds.index("/tmp/clone/.venv") - 1] == "--ro-bind"
    assert "/tmp/clone/.venv/bin" in binds and "/opt/python" not in binds
