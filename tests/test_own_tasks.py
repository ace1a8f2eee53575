"""A new user's path: own JSONL tasks and a grader file, init, eval, train (scripted models, no
environment variables); graders; strict config; acceptance decided on held-out val tasks."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import BOXED_SPEC, Roles, make_ws

from ecdysis.config import ConfigError, load_config
from ecdysis.envs.graders import load_grader
from ecdysis.models import ScriptedModel
from ecdysis.trainer import train_async

TASKS = [{"id": f"t{i}", "prompt": f"What is {i} plus {i + 1}?", "answer": str(2 * i + 1)} for i in range(12)]
GRADER = "def grade(answer, gold):\n    if answer == 'boom':\n        raise RuntimeError('odd answer')\n" \
         "    return (answer or '').strip() == str(gold)\n"


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ECDYSIS_")}  # a fresh user's shell
    env["HOME"] = str(cwd)  # no response cache or models from earlier runs
    return subprocess.run([sys.executable, "-m", "ecdysis", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**env, "COLUMNS": "200"})


def test_new_user_path_own_jsonl_and_grader_file(tmp_path: Path) -> None:
    (tmp_path / "tasks.jsonl").write_text("\n".join(json.dumps(t) for t in TASKS) + "\n")
    (tmp_path / "mygrader.py").write_text(GRADER)
    out = cli("init", "proj", "--env", "jsonl", "--tasks", "tasks.jsonl", "--grader", "mygrader.py:grade",
              cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "train /" in out.stdout and (tmp_path / "proj" / "harness" / "action.py").exists()
    # eval from another folder: the config carries absolute paths to the tasks and the grader
    sub = tmp_path / "elsewhere"
    sub.mkdir()
    out = cli("eval", "-c", "../proj/ecdysis.toml", "--model", "scripted:Answer: boom", "--split", "train",
              "--run-dir", "r", cwd=sub)
    assert out.returncode == 3, out.stdout + out.stderr  # the grader raised on every task; the batch went on
    assert "accuracy" in out.stdout and "0.000" in out.stdout and "grader_error" in out.stdout
    assert "the grader failed on" in out.stderr and "raised RuntimeError: odd answer" in out.stderr
    db = [p for p in (sub / "r").iterdir() if p.suffix == ".sqlite"][0]
    details = [json.loads(r[0])["score_detail"] for r in sqlite3.connect(db).execute("SELECT data FROM trajectories")]
    assert details and all("raised RuntimeError: odd answer" in d for d in details)
    spec = json.dumps(BOXED_SPEC)
    out = cli("train", "-c", "proj/ecdysis.toml", "--model", "scripted:The sum is \\boxed{3}",
              "--roles-model", f"scripted:{spec}", "--rounds", "1", "--run-dir", "t", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "edits decided on" in out.stdout and "test accuracy (final)" in out.stdout
    out = cli("train", "-c", "proj/ecdysis.toml", "--set", "train.roundz=2", cwd=tmp_path)
    assert out.returncode == 2 and "unknown key train.roundz; did you mean train.rounds?" in out.stderr
    out = cli("eval", "--env", "jsonl", "--tasks", "tasks.jsonl", "--grader", "nosuch.py:grade",
              "--model", "scripted:x", cwd=tmp_path)
    assert out.returncode == 2 and "file nosuch.py not found" in out.stderr


def test_builtin_graders() -> None:
    g = {name: load_grader(name) for name in ("exact", "normalized", "numeric", "choice", "regex", "contains")}
    assert g["exact"](" Paris ", "paris") and not g["exact"]("Paris.", "paris")
    assert g["normalized"]("The Paris.", "paris") and not g["normalized"](None, "paris")
    assert g["numeric"]("$1,234.0", 1234) and not g["numeric"]("1235", 1234)
    assert load_grader("numeric", tolerance=0.01)("1235", 1234)
    assert g["choice"]("(B) because", "B") and g["choice"]("B.", "b") and not g["choice"]("Because A", "B")
    assert g["regex"]("yes", "y(es)?") and not g["regex"]("yes sir", "y(es)?")
    assert g["contains"]("It is True, clearly", "true") and not g["contains"]("False", "true")
    with pytest.raises(ValueError, match="built-in name"):
        load_grader("nonsense")


def test_unknown_config_keys_are_refused_with_the_nearest_name(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[train]\nroundz = 5\n[agnet]\nmodel = 'x'\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "train.roundz; did you mean train.rounds?" in str(err.value)
    assert "'agnet'" in str(err.value) or "agnet; did you mean agent?" in str(err.value)
    assert load_config(None, ['model_settings."local:qwen2.5-coder-1.5b".n_ctx=8192']).model_settings[
        "local:qwen2.5-coder-1.5b"].n_ctx == 8192


async def test_acceptance_is_decided_on_val_tasks_no_role_sees(tmp_path: Path) -> None:
    roles = Roles()
    ws = make_ws(tmp_path, roles, ScriptedModel(lambda m: "so \\boxed{7}", name="sevens"), "train.rounds=1",
                 "train.min_val_tasks=2", "train.engine.skip_debate_when_verified=false")
    rows = [json.loads(line) for line in (tmp_path / "tasks.jsonl").read_text().splitlines()]
    for row in rows[6:8]:
        row["split"] = "val"
    (tmp_path / "tasks.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    result = await train_async(ws.config, "ecdysis", ws=ws)
    assert result.accept_rule.accept_on == "val" and result.accept_rule.tasks == 2
    decision = ws.store.get_record(result.run_id, "decision", "r1")
    assert decision["decided_on"] == "val"
    val_prompts = [r["prompt"] for r in rows[6:8]]
    seen = [m.content for model in ("analyst", "moderator") for c in ws.backends[f"{model}|scripted:agent"].calls
            for m in c.messages]
    assert seen and not any(p in text for p in val_prompts for text in seen)
    assert result.val_before is not None and result.val_after is not None


def test_json_output_and_narrow_tables_keep_the_names_users_copy(tmp_path: Path) -> None:
    (tmp_path / "tasks.jsonl").write_text("\n".join(json.dumps(t) for t in TASKS) + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ECDYSIS_")} | {"COLUMNS": "60"}
    run = lambda *a: subprocess.run([sys.executable, "-m", "ecdysis", *a], cwd=tmp_path, capture_output=True,  # noqa: E731
                                    text=True, timeout=120, env=env)
    listing = run("models", "list")
    assert listing.returncode == 0 and "local:qwen2.5-coder-1.5b" in listing.stdout  # a pipe at 60 columns
    models = json.loads(run("models", "list", "--json").stdout)
    assert {m["reference"] for m in models} >= {"local:smollm2-135m", "local:qwen2.5-coder-1.5b"}
    out = run("eval", "--env", "jsonl", "--tasks", "tasks.jsonl", "--grader", "numeric", "--model",
              "scripted:Answer: 3", "--split", "train", "--run-dir", "r", "--json")
    summary = json.loads(out.stdout)
    assert summary["split"] == "train" and summary["n_tasks"] > 0 and 0 <= summary["accuracy"] <= 1
    runs = json.loads(run("runs", "list", "--run-dir", "r", "--json").stdout)
    assert [r["id"] for r in runs] == [summary["run_id"]] and runs[0]["evaluations"] == 1
    shown = json.loads(run("show", summary["run_id"], "--run-dir", "r", "--json").stdout)
    assert shown["evaluations"][0]["done"] == summary["n_tasks"] and shown["run"]["config"]["env"]["name"] == "jsonl"
    table = run("runs", "list", "--run-dir", "r").stdout
    assert summary["run_id"] in table


def test_plugin_path_init_with_options_and_eval_of_chosen_tasks_with_a_scripted_list(tmp_path: Path) -> None:
    example = Path(__file__).resolve().parents[1] / "examples"
    made = cli("init", str(tmp_path / "hd"), "--env", "helpdesk_env:environment", "--set",
               f"env.options.tasks_file={example / 'helpdesk' / 'tasks.jsonl'}", cwd=example / "helpdesk")
    assert made.returncode == 0, made.stderr
    assert "options = { tasks_file = " in (tmp_path / "hd" / "ecdysis.toml").read_text()
    made = cli("init", str(tmp_path / "fn"), "--env", "functions_env:environment", cwd=example / "functions")
    assert made.returncode == 0, made.stderr
    sys.path.insert(0, str(example / "functions"))
    import functions_env

    task = next(t for t in functions_env.all_tasks() if t.split == "train" and t.meta["type"] == "weather_pair")
    script = tmp_path / "replies.json"
    script.write_text(json.dumps([{"text": "", "tool_calls": task.gold}]))  # two calls at once
    out = cli("eval", "-c", str(tmp_path / "fn" / "ecdysis.toml"), "--model", f"scripted:@{script}", "--split",
              "train", "--task", task.id, "--json", "--run-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["n_tasks"] == 1 and summary["accuracy"] == 1.0 and summary["terminations"] == {"done": 1}
    shown = cli("show", summary["run_id"], "--run-dir", str(tmp_path / "runs"), "--json", cwd=tmp_path)
    assert json.loads(shown.stdout)["evaluations"][0]["per_task"] == {task.id: 1.0}  # per-task scores
    missing = cli("eval", "-c", str(tmp_path / "fn" / "ecdysis.toml"), "--split", "train", "--task", "nope",
                  "--run-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert missing.returncode != 0 and "no task 'nope'" in missing.stderr


def test_env_options_naming_files_next_to_the_config_are_relative_to_it(tmp_path: Path) -> None:
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "db.json").write_text("{}")
    path = tmp_path / "cfg" / "c.toml"
    path.write_text('[env]\nname = "jsonl"\noptions = { path = "t.jsonl", db_file = "db.json", mode = "fast" }\n')
    options = load_config(path).env.options
    assert options == {"path": str(tmp_path / "cfg" / "t.jsonl"), "db_file": str(tmp_path / "cfg" / "db.json"),
                       "mode": "fast"}
