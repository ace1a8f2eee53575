"""The command line end to end (scripted agent model): init, eval, kill and resume, bad input."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from ecdysis.store import DB_NAME, RunStore


def ecdysis(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ecdysis", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "COLUMNS": "200"})


def test_init_then_eval_with_scripted_model(tmp_path: Path, data_dir: Path) -> None:
    out = ecdysis("init", "proj", "--env", "gsm8k", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "proj" / "harness" / "harness.toml").exists()
    assert (tmp_path / "proj" / "ecdysis.toml").exists()
    out = ecdysis("eval", "-c", "proj/ecdysis.toml", "--model", "scripted:Answer: 18", "--limit", "3",
                  "--data-dir", str(data_dir), "--run-dir", "r", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "accuracy" in out.stdout and "answered=3" in out.stdout
    store = RunStore(tmp_path / "r")
    (run,) = store.runs()
    (evaluation,) = store.evaluations(run["id"])
    assert len(store.trajectories(evaluation["id"])) == 3
    listing = ecdysis("runs", "list", "--run-dir", "r", cwd=tmp_path)
    assert run["id"] in listing.stdout
    shown = ecdysis("show", run["id"][:12], "--run-dir", "r", cwd=tmp_path)
    assert shown.returncode == 0 and "Model calls by role" in shown.stdout


SLOW_ACTION = (
    "import time\nfrom ecdysis.harness.api import answer\n"
    "def realize(reply, ctx):\n    time.sleep(0.6)\n    return answer('1')\n"
)


def slow_eval(tmp_path: Path, data_dir: Path, limit: int) -> list[str]:
    """A project whose harness takes 0.6 s per episode, and the eval command line for it."""
    assert ecdysis("init", "proj", cwd=tmp_path).returncode == 0
    (tmp_path / "proj" / "harness" / "action.py").write_text(SLOW_ACTION)
    return [sys.executable, "-m", "ecdysis", "eval", "--harness", "proj/harness", "--model", "scripted:Answer: 1",
            "--limit", str(limit), "--concurrency", "1", "--data-dir", str(data_dir), "--run-dir", "r"]


def test_killed_eval_leaves_readable_store_and_resumes(tmp_path: Path, data_dir: Path) -> None:
    args = slow_eval(tmp_path, data_dir, limit=10)
    proc = subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    db = tmp_path / "r" / DB_NAME
    deadline = time.time() + 60
    done = 0
    while time.time() < deadline and done < 3:
        time.sleep(0.2)
        if db.exists():
            try:
                done = sqlite3.connect(db).execute("SELECT COUNT(*) FROM trajectories").fetchone()[0]
            except sqlite3.OperationalError:
                pass
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    store = RunStore(tmp_path / "r")
    (run,) = store.runs()
    (evaluation,) = store.evaluations(run["id"])
    kept = store.trajectories(evaluation["id"])
    assert 3 <= len(kept) < 10 and all(t.termination == "answered" for t in kept)
    calls_before = len(sqlite3.connect(db).execute("SELECT id FROM model_calls").fetchall())
    out = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert len(store.trajectories(evaluation["id"])) == 10
    calls_after = len(sqlite3.connect(db).execute("SELECT id FROM model_calls").fetchall())
    assert calls_after - calls_before <= 10 - len(kept) + 1  # finished tasks were not run again
    assert [r["id"] for r in store.runs()] == [run["id"]]


def test_bad_inputs_give_clear_errors(tmp_path: Path, data_dir: Path) -> None:
    assert ecdysis("init", "proj", cwd=tmp_path).returncode == 0
    harness = tmp_path / "proj" / "harness"
    (harness / "action.py").write_text("def realize(reply, ctx)\n    pass\n")
    base = ["eval", "--model", "scripted:x", "--data-dir", str(data_dir), "--run-dir", "r", "--limit", "1"]
    out = ecdysis(*base, "--harness", str(harness), cwd=tmp_path)
    assert out.returncode == 2 and "action.py, line 1: syntax error" in out.stdout
    assert not (tmp_path / "r").exists()  # nothing half-written
    (harness / "harness.toml").unlink()
    out = ecdysis(*base, "--harness", str(harness), cwd=tmp_path)
    assert out.returncode == 2 and "no harness.toml" in out.stdout
    out = ecdysis("eval", "--env", "webshop", "--model", "scripted:x", "--run-dir", "r2", cwd=tmp_path)
    assert out.returncode == 2 and "unknown environment 'webshop'" in out.stdout
    out = ecdysis("eval", "--model", "nonsense", "--data-dir", str(data_dir), "--run-dir", "r3", cwd=tmp_path)
    assert out.returncode == 2 and "Known forms" in out.stdout
    bad = tmp_path / "bad.toml"
    bad.write_text("[eval]\ntrials = 'many'\n")
    out = ecdysis("eval", "-c", str(bad), cwd=tmp_path)
    assert out.returncode == 2 and "trials" in out.stdout
    out = ecdysis("chat", "http://127.0.0.1:9/v1::m", "hi", cwd=tmp_path)
    assert out.returncode == 2 and "cannot reach" in out.stdout


def test_compare_prints_one_column_per_arm_and_writes_files(tmp_path: Path, data_dir: Path) -> None:
    assert ecdysis("init", "proj", "--env", "gsm8k", cwd=tmp_path).returncode == 0
    sets = ['agent.model="scripted:Answer: 18"', "train.train_limit=3", "train.test_limit=3", "train.rounds=1",
            f'cache.path="{tmp_path / "cache.sqlite"}"', f'run.run_dir="{tmp_path / "cmp"}"']
    out = ecdysis("compare", "proj/ecdysis.toml", "--arms", "fixed,serial,ecdysis", "--data-dir", str(data_dir),
                  *[arg for s in sets for arg in ("--set", s)], cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    header = next(line for line in out.stdout.splitlines() if "measure" in line)
    assert all(f"{arm} s0" in header for arm in ("fixed", "serial", "ecdysis"))
    assert "speed-up vs serial" in out.stdout and "test acc - fixed" in out.stdout
    rows = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert [r["arm"] for r in rows] == ["fixed", "serial", "ecdysis"]
    assert (tmp_path / "cmp" / "compare.csv").read_text().count("\n") == 4


def test_init_from_a_plugin_writes_a_native_seed_that_evaluates(tmp_path: Path) -> None:
    example = Path(__file__).resolve().parents[1] / "examples" / "helpdesk"
    missing = ecdysis("init", str(tmp_path / "x"), "--env", "no_such_module:env", cwd=tmp_path)
    assert missing.returncode == 2 and "cannot import module 'no_such_module'" in missing.stdout
    out = ecdysis("init", str(tmp_path / "proj"), "--env", "helpdesk_env:environment", cwd=example)
    assert out.returncode == 0, out.stdout + out.stderr
    manifest = (tmp_path / "proj" / "harness" / "harness.toml").read_text()
    assert 'tool_calling = "native"' in manifest and 'env = "helpdesk_env:environment"' in manifest
    assert "refund" in (tmp_path / "proj" / "harness" / "contract.md").read_text().lower()  # the plugin's policy
    assert str(example) in (tmp_path / "proj" / "ecdysis.toml").read_text()  # plugin_path for the sandbox
    out = ecdysis("eval", "-c", "proj/ecdysis.toml", "--model", "scripted:The customer is on the pro plan.",
                  "--split", "train", "--run-dir", "r", cwd=tmp_path)  # from another folder: plugin_path works
    assert out.returncode == 0, out.stdout + out.stderr
    assert "answered=8" in out.stdout and "0.125" in out.stdout  # only the plan question is answered right


def test_a_second_process_on_the_same_run_dir_is_refused(tmp_path: Path, data_dir: Path) -> None:
    args = slow_eval(tmp_path, data_dir, limit=6)
    first = subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline and not (tmp_path / "r" / ".ecdysis.lock").exists():
        time.sleep(0.1)
    time.sleep(0.5)
    second = ecdysis(*args[3:], cwd=tmp_path)
    assert second.returncode == 2 and "is in use by pid" in second.stdout
    listing = ecdysis("runs", "list", "--run-dir", "r", cwd=tmp_path)
    assert listing.returncode == 0  # reading is fine while it runs
    first.send_signal(signal.SIGKILL)
    first.wait()
    third = ecdysis(*args[3:], cwd=tmp_path)  # the lock died with the killed process: resume works
    assert third.returncode == 0, third.stdout + third.stderr
