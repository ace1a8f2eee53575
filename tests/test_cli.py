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
from ecdysis.trainer.methods import DEFAULT_METHOD


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
    assert out.returncode == 2 and "action.py, line 1: syntax error" in out.stderr and not out.stdout
    assert not (tmp_path / "r").exists()  # nothing half-written
    (harness / "harness.toml").unlink()
    out = ecdysis(*base, "--harness", str(harness), cwd=tmp_path)
    assert out.returncode == 2 and "no harness.toml" in out.stderr
    out = ecdysis("eval", "--env", "webshop", "--model", "scripted:x", "--run-dir", "r2", cwd=tmp_path)
    assert out.returncode == 2 and "unknown environment 'webshop'" in out.stderr
    out = ecdysis("eval", "--model", "nonsense", "--data-dir", str(data_dir), "--run-dir", "r3", cwd=tmp_path)
    assert out.returncode == 2 and "Known forms" in out.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text("[eval]\ntrials = 'many'\n")
    out = ecdysis("eval", "-c", str(bad), cwd=tmp_path)
    assert out.returncode == 2 and "trials" in out.stderr
    out = ecdysis("chat", "http://127.0.0.1:9/v1::m", "hi", cwd=tmp_path)
    assert out.returncode == 2 and "cannot reach" in out.stderr


def test_compare_prints_one_column_per_arm_and_writes_files(tmp_path: Path, data_dir: Path) -> None:
    assert ecdysis("init", "proj", "--env", "gsm8k", cwd=tmp_path).returncode == 0
    sets = ['agent.model="scripted:Answer: 18"', "train.train_limit=3", "train.test_limit=3", "train.rounds=1",
            f'cache.path="{tmp_path / "cache.sqlite"}"']
    out = ecdysis("compare", "-c", "proj/ecdysis.toml", "--arms", "fixed,serial,ecdysis", "--data-dir", str(data_dir),
                  "--run-dir", str(tmp_path / "cmp"),
                  *[arg for s in sets for arg in ("--set", s)], cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    header = next(line for line in out.stdout.splitlines() if "measure" in line)
    assert all(f"{arm} s0" in header for arm in ("fixed", "serial", "ecdysis"))
    assert "speed-up vs serial" in out.stdout and "test acc - fixed" in out.stdout
    assert out.stderr.count("new run ") == 4 and "new run fixed-seed0-" in out.stderr  # one run per arm, and
    assert "new run seed-eval-seed0-" in out.stderr  # the seed evaluation the training arms share (issue 38)
    rows = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert [r["arm"] for r in rows] == ["fixed", "serial", "ecdysis"]
    assert (tmp_path / "cmp" / "compare.csv").read_text().count("\n") == 4


def test_init_from_a_plugin_writes_a_native_seed_that_evaluates(tmp_path: Path) -> None:
    example = Path(__file__).resolve().parents[1] / "examples" / "helpdesk"
    missing = ecdysis("init", str(tmp_path / "x"), "--env", "no_such_module:env", cwd=tmp_path)
    assert missing.returncode == 2 and "cannot import module 'no_such_module'" in missing.stderr
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
    args = slow_eval(tmp_path, data_dir, limit=20)  # 12 s of episodes: still running when the second starts
    first = subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline and not (tmp_path / "r" / ".ecdysis.lock").exists():
        time.sleep(0.1)
    time.sleep(0.5)
    second = ecdysis(*args[3:], cwd=tmp_path)
    assert second.returncode == 2 and "is in use by pid" in second.stderr
    listing = ecdysis("runs", "list", "--run-dir", "r", cwd=tmp_path)
    assert listing.returncode == 0  # reading is fine while it runs
    first.send_signal(signal.SIGKILL)
    first.wait()
    third = ecdysis(*args[3:], cwd=tmp_path)  # the lock died with the killed process: resume works
    assert third.returncode == 0, third.stdout + third.stderr


def scripted_project(tmp_path: Path, folder: str = "proj") -> Path:
    """A gsm8k project (seed harness, config with run_dir inside it) whose agent always answers 18."""
    assert ecdysis("init", folder, "--env", "gsm8k", cwd=tmp_path).returncode == 0
    config = tmp_path / folder / "ecdysis.toml"
    config.write_text(config.read_text().replace('model = "local:qwen2.5-coder-1.5b"', 'model = "scripted:Answer: 18"'))
    return config


def test_json_output_stays_parseable_and_notices_go_to_stderr(tmp_path: Path, data_dir: Path) -> None:
    config = scripted_project(tmp_path)
    out = ecdysis("eval", "-c", str(config), "--limit", "2", "--data-dir", str(data_dir), "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)  # nothing but the JSON on stdout
    assert summary["split"] == "val"  # eval.split defaults to val: test only when asked
    assert f"new run {summary['run_id']}" in out.stderr
    again = ecdysis("eval", "-c", str(config), "--limit", "2", "--data-dir", str(data_dir), "--json", cwd=tmp_path)
    assert json.loads(again.stdout)["run_id"] == summary["run_id"] and f"resuming {summary['run_id']}" in again.stderr
    tested = json.loads(ecdysis("eval", "-c", str(config), "--limit", "2", "--split", "test", "--data-dir",
                                str(data_dir), "--json", cwd=tmp_path).stdout)
    assert tested["split"] == "test" and tested["run_id"] != summary["run_id"]
    bad = ecdysis("eval", "-c", str(config), "--model", "nonsense", "--json", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stdout == "" and "error:" in bad.stderr
    shown = ecdysis("show", "-c", str(config), "--json", cwd=tmp_path)  # the config's run dir, the latest run
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["run"]["id"] == tested["run_id"]
    listed = json.loads(ecdysis("runs", "list", "-c", str(config), "--json", cwd=tmp_path).stdout)
    assert {r["id"] for r in listed} == {summary["run_id"], tested["run_id"]}
    nothing = ecdysis("show", "--run-dir", str(tmp_path / "empty"), cwd=tmp_path)
    assert nothing.returncode == 2 and "holds no run database" in nothing.stderr


def test_run_ids_do_not_change_when_the_project_folder_moves(tmp_path: Path, data_dir: Path) -> None:
    from ecdysis.config import load_config
    from ecdysis.trainer.api import run_id_for

    (tmp_path / "a").mkdir()
    config = scripted_project(tmp_path / "a")
    args = ["eval", "--limit", "2", "--data-dir", str(data_dir), "--json"]
    first = json.loads(ecdysis(*args, "-c", str(config), cwd=tmp_path).stdout)
    train_id = run_id_for(load_config(config), "ecdysis")
    (tmp_path / "a").rename(tmp_path / "b")
    moved = tmp_path / "b" / "proj" / "ecdysis.toml"
    out = ecdysis(*args, "-c", str(moved), cwd=tmp_path)
    assert json.loads(out.stdout)["run_id"] == first["run_id"] and f"resuming {first['run_id']}" in out.stderr
    assert run_id_for(load_config(moved), "ecdysis") == train_id
    (tmp_path / "b" / "proj" / "harness" / "contract.md").write_text("Reply with the number only.\n")
    assert run_id_for(load_config(moved), "ecdysis") != train_id  # another seed harness is another run


def test_train_ends_with_the_result_the_diff_and_the_report(tmp_path: Path, data_dir: Path) -> None:
    config = scripted_project(tmp_path)
    (tmp_path / "proj" / "harness" / "contract.md").write_text("Solve the problem. End with \\boxed{N}.\n")
    args = ["train", "-c", str(config), "--model", "scripted:The answer is \\boxed{18}.", "--data-dir", str(data_dir),
            "--set", "train.train_limit=4", "--set", "train.val_limit=4", "--set", "train.test_limit=4",
            "--set", "train.rounds=1"]
    out = ecdysis(*args, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    run_id = next(w for w in out.stderr.split() if w.startswith(f"train-{DEFAULT_METHOD}-"))  # no --arm: the default
    assert f"new run {run_id}" in out.stderr
    assert "Held-out test" in out.stdout and "What changed" in out.stdout and "round 1:" in out.stdout
    decided = out.stdout.count("decision: ")  # one line per per-failure step, naming its target task
    assert decided >= 1 and out.stdout.count("decision: accepted (serial edit for ") + \
        out.stdout.count("decision: rejected (serial edit for ") == decided, out.stdout
    report = tmp_path / "proj" / "runs" / f"report-{run_id}.html"
    assert f"Report {report.resolve()}" in out.stdout and report.stat().st_size > 1000
    tail = out.stdout.strip().splitlines()
    assert tail[-1].startswith("Report ")
    again = ecdysis(*args, "--no-report", cwd=tmp_path, timeout=300)
    assert again.returncode == 0 and f"resuming {run_id}" in again.stderr and "Report " not in again.stdout
    diff = ecdysis("diff", "-c", str(config), cwd=tmp_path)  # the latest training run, seed -> final
    assert diff.returncode == 0 and " -> " in diff.stdout, diff.stderr
    made = ecdysis("report", "-c", str(config), "-o", str(tmp_path / "r.html"), cwd=tmp_path)
    assert made.returncode == 0 and (tmp_path / "r.html").exists(), made.stderr


def test_compare_takes_the_config_as_c_or_positional(tmp_path: Path) -> None:
    config = scripted_project(tmp_path)
    for form in (["-c", str(config)], [str(config)], [str(config), "-c", str(config)]):
        out = ecdysis("compare", *form, "--arms", "nonsense", cwd=tmp_path)
        assert out.returncode == 2 and "unknown arm(s) ['nonsense']" in out.stderr, (form, out.stderr)
    out = ecdysis("compare", "--arms", "fixed", cwd=tmp_path)
    assert out.returncode == 2 and "compare needs a config" in out.stderr
    other = tmp_path / "other.toml"
    other.write_text("")
    out = ecdysis("compare", str(config), "-c", str(other), cwd=tmp_path)
    assert out.returncode == 2 and "two configs given" in out.stderr


BOOM_ENV = "def environment(data_dir=None, seed=0, **options):\n    raise RuntimeError('boom in the plugin')\n"


def test_internal_errors_are_one_line_unless_debug(tmp_path: Path) -> None:
    (tmp_path / "boom_env.py").write_text(BOOM_ENV)
    args = ["eval", "--env", "boom_env:environment", "--model", "scripted:x", "--run-dir", "r"]
    out = ecdysis(*args, cwd=tmp_path)
    assert out.returncode == 1
    assert "internal error: RuntimeError: boom in the plugin" in out.stderr and "--debug" in out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""
    for debug in (["--debug", *args], [*args, "--debug"]):
        out = ecdysis(*debug, cwd=tmp_path)
        assert out.returncode == 1 and "Traceback (most recent call last)" in out.stderr
        assert "boom_env.py" in out.stderr and "RuntimeError: boom in the plugin" in out.stderr


async def test_the_end_of_train_screen_shows_what_changed_and_the_diff(tmp_path: Path) -> None:
    from io import StringIO

    from helpers import Roles, add_answer, make_ws
    from rich.console import Console

    from ecdysis.cli.runs import clipped_diff, finish_train
    from ecdysis.models import ScriptedModel
    from ecdysis.trainer import train_async

    ws = make_ws(tmp_path, Roles(), ScriptedModel(add_answer, name="adder"), "train.rounds=1")
    result = await train_async(ws.config, "ecdysis", ws=ws)  # a round and its spec
    assert result.final_harness_id != result.seed_harness_id  # the scripted roles' repair was accepted
    buffer = StringIO()
    path = finish_train(Console(file=buffer, width=200), ws.store, result.run_id)
    text = buffer.getvalue()
    assert "round 1: accepted" in text and "enable_repair boxed_answer" in text
    assert f"Harness diff {result.seed_harness_id[:8]} -> {result.final_harness_id[:8]}" in text
    assert '+["boxed_answer"]' in text
    assert f"Held-out test {result.test_before['accuracy']:.3f} (seed) -> {result.test_after['accuracy']:.3f}" in text
    assert path is not None and path.exists() and text.strip().endswith(str(path))
    ws.close()
    lines, left = clipped_diff("\n".join(f"+line {i}" for i in range(30)) + "\n+" + "x" * 400, limit=24)
    assert len(lines) == 24 and left == 7
    assert max(map(len, clipped_diff("+" + "x" * 400)[0])) < 160
