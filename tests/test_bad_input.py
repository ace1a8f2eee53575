"""Bad values, bad task files and user errors are refused with what, where and what to do (exit 2, never an
internal error); run-id prefixes must be unique; Ctrl-C and SIGTERM mark the run interrupted and it resumes."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import types
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from ecdysis.config import Config, ConfigError, load_config
from ecdysis.models.registry import ModelSettings
from ecdysis.store import DB_NAME, RunStore


def ecdysis(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ecdysis", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "COLUMNS": "200"})


def user_error(out: subprocess.CompletedProcess[str], *expected: str) -> None:
    """Exit 2 with `error:` and every expected text on stderr; no traceback, no internal error, no pydantic URL."""
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    assert "error:" in out.stderr and "internal error" not in out.stderr and "Traceback" not in out.stderr
    assert "pydantic" not in out.stderr, out.stderr
    for text in expected:
        assert text in out.stderr, (text, out.stderr)


TASKS = [{"id": f"t{i}", "prompt": f"What is {i} plus {i}?", "answer": str(2 * i)} for i in range(8)]


def jsonl_project(tmp_path: Path, tasks: list[dict[str, object]] = TASKS) -> Path:
    """A JSONL project (normalized grader) whose config is proj/ecdysis.toml."""
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    out = ecdysis("init", "proj", "--env", "jsonl", "--tasks", "tasks.jsonl", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    return tmp_path / "proj" / "ecdysis.toml"


# ---- the config refuses what cannot run ---------------------------------------------------------------------

def test_values_that_cannot_run_are_refused_naming_the_set_option(tmp_path: Path) -> None:
    config = jsonl_project(tmp_path)
    run = ["eval", "-c", str(config), "--model", "scripted:0", "--split", "train", "--run-dir", "r"]
    for override, why in [("run.concurrency=0", "run.concurrency should be >= 1 (got 0)"),  # hung forever
                          ("eval.limit=-5", 'eval.limit should be a whole number of tasks >= 1, or "all"'),
                          ("eval.limit=0", 'eval.limit should be a whole number of tasks >= 1, or "all"'),
                          ("eval.trials=0", "eval.trials should be >= 1 (got 0)"),
                          ("sandbox.timeout_s=-1", "sandbox.timeout_s should be > 0 (got -1)"),
                          ("eval.limit=abc", "(got 'abc')")]:
        out = ecdysis(*run, "--set", override, cwd=tmp_path, timeout=60)
        user_error(out, f"--set {override}: ", why)
        assert str(config.name) not in out.stderr  # the value came from the command line, not the file
    out = ecdysis(*run, "--limit", "0", "--trials", "0", cwd=tmp_path)
    user_error(out, "2 problems", "--limit 0: eval.limit", "--trials 0: eval.trials")
    assert not (tmp_path / "r").exists()  # refused before anything was written
    config.write_text(config.read_text().replace("trials = 1", "trials = 0"))
    line = config.read_text().splitlines().index("trials = 0") + 1
    user_error(ecdysis(*run, cwd=tmp_path), f"{config}, line {line}: eval.trials should be >= 1 (got 0)")
    out = ecdysis(*run, "--set", "eval.trials=1", "--set", "eval.limit=all", "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    from ecdysis.envs.jsonl_suite import from_options

    train = from_options(path=str(tmp_path / "tasks.jsonl")).tasks("train")
    assert json.loads(out.stdout)["n_tasks"] == len(train) > 0  # "all": every train task


def _numeric(annotation: object) -> bool:
    if typing.get_origin(annotation) is typing.Annotated:
        return _numeric(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_numeric(a) for a in typing.get_args(annotation))
    return annotation in (int, float)


def numeric_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every int or float key under `model`, dotted (model settings under one model reference)."""
    keys = []
    for name, field in model.model_fields.items():
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            keys += numeric_keys(field.annotation, f"{prefix}{name}.")
        elif _numeric(field.annotation):
            keys.append(f"{prefix}{name}")
    if model is Config:
        keys += numeric_keys(ModelSettings, 'model_settings."scripted:x".')
    return keys


def test_every_numeric_key_of_the_config_tree_has_a_bound() -> None:
    keys = [k for k in numeric_keys(Config) if k != "run.seed"]  # any seed is a seed
    assert len(keys) > 40 and "train.engine.eval_batch" in keys and 'model_settings."scripted:x".n_ctx' in keys
    for key in keys:
        with pytest.raises(ConfigError) as info:
            load_config(None, [f"{key}=-1"])
        assert f"--set {key}=-1: {key} should be" in str(info.value), key
    for key in ("eval.limit", "train.train_limit", "train.val_limit", "train.test_limit", "run.concurrency",
                "eval.trials", "train.rounds", "sandbox.timeout_s", "train.implementer_timeout_s"):
        with pytest.raises(ConfigError):
            load_config(None, [f"{key}=0"])
    cfg = load_config(None, ["train.test_limit=all", "train.engine.eval_batch=0", "run.episode_retries=0"])
    assert cfg.train.test_limit is None and cfg.train.engine.eval_batch == 0


# ---- task files ---------------------------------------------------------------------------------------------

BAD_TASK_FILES = {
    "empty.jsonl": (b"", "empty.jsonl: no tasks: the file is empty"),
    "binary.jsonl": (b'{"id": "a", "prompt": "p", "answer": "1"}\n\xff\xfe\x00garbage\n',
                     "binary.jsonl:2: not UTF-8 text"),
    "dup.jsonl": (b'{"id": "a", "prompt": "p", "answer": "1"}\n{"id": "b", "prompt": "q", "answer": "2"}\n'
                  b'{"id": "a", "prompt": "r", "answer": "3"}\n', "dup.jsonl:3: duplicate id 'a' (also on line 1)"),
    "intid.jsonl": (b'{"id": 7, "prompt": "p", "answer": "1"}\n', "intid.jsonl:1: field 'id' should be a string"),
    "noprompt.jsonl": (b'{"id": "a", "prompt": " ", "answer": "1"}\n', "noprompt.jsonl:1: field 'prompt' is empty"),
    "noanswer.jsonl": (b'{"id": "a", "prompt": "p", "answer": ""}\n', "noanswer.jsonl:1: field 'answer' is empty"),
}


@pytest.mark.parametrize("name", list(BAD_TASK_FILES))
def test_a_bad_task_file_is_refused_with_file_and_line(tmp_path: Path, name: str) -> None:
    content, message = BAD_TASK_FILES[name]
    (tmp_path / name).write_bytes(content)
    out = ecdysis("init", "proj", "--env", "jsonl", "--tasks", name, cwd=tmp_path)
    user_error(out, message)
    assert not (tmp_path / "proj" / "ecdysis.toml").exists()
    out = ecdysis("eval", "--env", "jsonl", "--tasks", name, "--model", "scripted:1", "--run-dir", "r", cwd=tmp_path)
    user_error(out, message)


def test_train_refuses_a_suite_without_test_tasks_and_marks_nothing_running(tmp_path: Path) -> None:
    config = jsonl_project(tmp_path, [t | {"split": "train"} for t in TASKS])
    out = ecdysis("train", "-c", str(config), "--model", "scripted:Answer: 0", "--run-dir", "r", cwd=tmp_path)
    user_error(out, "the test split of environment 'jsonl' has no tasks")
    assert "test accuracy" not in out.stdout
    runs = json.loads(ecdysis("runs", "list", "--run-dir", "r", "--json", cwd=tmp_path).stdout)
    assert [r["status"] for r in runs] == ["failed"]  # not `running` forever


# ---- user errors that were internal errors or had no location -----------------------------------------------

def test_user_errors_say_what_where_and_what_to_do(tmp_path: Path) -> None:
    config = jsonl_project(tmp_path)
    run = ["eval", "-c", str(config), "--model", "scripted:0", "--split", "train"]
    (tmp_path / "afile").write_text("x")
    user_error(ecdysis(*run, "--run-dir", "afile", cwd=tmp_path), "run directory afile is a file, not a folder")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / DB_NAME).write_bytes(os.urandom(4096))
    for args in (run + ["--run-dir", "bad"], ["runs", "list", "--run-dir", "bad"], ["show", "--run-dir", "bad"]):
        user_error(ecdysis(*args, cwd=tmp_path), f"bad/{DB_NAME} is not a usable run database", "--run-dir")
    user_error(ecdysis(*run, "--model", "scripted:@nofile.json", "--run-dir", "r", cwd=tmp_path),
               "scripted:@nofile.json: cannot read the reply file nofile.json", "JSON list of replies")
    user_error(ecdysis("eval", "-c", "nope.toml", cwd=tmp_path), "config file nope.toml does not exist")
    (tmp_path / "notes.toml").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    user_error(ecdysis("eval", "-c", "notes.toml", cwd=tmp_path), "config file notes.toml is not UTF-8 text")
    user_error(ecdysis("eval", "-c", str(tmp_path), cwd=tmp_path), "is a directory; pass the TOML file in it")
    user_error(ecdysis(*run, "--set", "env.options.tolerance=x", cwd=tmp_path),
               "env.options.tolerance should be a number >= 0 (got 'x')")
    user_error(ecdysis("eval", "--env", "gsm8k", "--set", "env.options.colour=1", "--model", "scripted:1",
                       cwd=tmp_path), "environment 'gsm8k' has no option(s) env.options.colour")
    user_error(ecdysis("eval", "--env", "gsm8k", "--data-dir", "no/such/dir", "--model", "scripted:1", cwd=tmp_path),
               "data dir no/such/dir does not exist")
    user_error(ecdysis(*run, "--harness", "afile", cwd=tmp_path), "afile: is a file, not a harness directory")


# ---- run-id prefixes ----------------------------------------------------------------------------------------

def test_an_ambiguous_run_prefix_lists_the_candidates_and_diff_refuses_eval_runs(tmp_path: Path) -> None:
    config = jsonl_project(tmp_path)
    ids = []
    for answer in ("0", "2", "4"):
        out = ecdysis("eval", "-c", str(config), "--model", f"scripted:{answer}", "--split", "train", "--run-dir", "r",
                      "--json", cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        ids.append(json.loads(out.stdout)["run_id"])
    out = ecdysis("show", "eval-", "--run-dir", "r", cwd=tmp_path)
    user_error(out, "run id prefix 'eval-' matches 3 runs", *ids)
    assert out.stdout == ""  # not the oldest run's detail
    unique = ids[-1][:12] if all(i[:12] != ids[-1][:12] for i in ids[:-1]) else ids[-1]
    shown = ecdysis("show", unique, "--run-dir", "r", "--json", cwd=tmp_path)
    assert shown.returncode == 0 and json.loads(shown.stdout)["run"]["id"] == ids[-1]
    user_error(ecdysis("diff", ids[0], "--run-dir", "r", cwd=tmp_path),
               f"{ids[0]} is an eval run: it has no harness lineage to diff")
    from ecdysis.store import AmbiguousRunId

    store = RunStore(tmp_path / "r")
    with pytest.raises(AmbiguousRunId):
        store.run("eval-")
    assert store.run(ids[1])["id"] == ids[1] and store.run("EVAL-") is None  # ids are case-sensitive


# ---- Ctrl-C and SIGTERM -------------------------------------------------------------------------------------

SLOW_ACTION = (
    "import time\nfrom ecdysis.harness.api import answer\n"
    "def realize(reply, ctx):\n    time.sleep(0.5)\n    return answer('1')\n"
)


@pytest.mark.parametrize(("signum", "status", "sigint"), [(signal.SIGINT, 130, signal.SIG_DFL),
                                                         (signal.SIGTERM, 143, signal.SIG_DFL),
                                                         (signal.SIGTERM, 143, signal.SIG_IGN)])
def test_an_interrupted_eval_is_marked_interrupted_and_resumes(tmp_path: Path, data_dir: Path, signum: int,
                                                                 status: int, sigint: signal.Handlers) -> None:
    """SIGINT as a terminal's Ctrl-C; SIGTERM to a foreground command and to a background job (whose SIGINT is
    ignored, as `cmd &` in a script leaves it): each prints one message, no traceback, and loses nothing."""
    assert ecdysis("init", "proj", cwd=tmp_path).returncode == 0
    (tmp_path / "proj" / "harness" / "action.py").write_text(SLOW_ACTION)
    args = [sys.executable, "-m", "ecdysis", "eval", "--harness", "proj/harness", "--model", "scripted:Answer: 1",
            "--limit", "8", "--concurrency", "1", "--data-dir", str(data_dir), "--run-dir", "r"]
    # its own process group, as a terminal's Ctrl-C reaches every process of the foreground job; SIGINT's
    # disposition set here whatever the test suite's own is (a background job ignores SIGINT)
    proc = subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, sigint))  # noqa: PLW1509
    db, done, deadline = tmp_path / "r" / DB_NAME, 0, time.time() + 90
    while done < 2 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
        try:
            done = sqlite3.connect(db).execute("SELECT COUNT(*) FROM trajectories").fetchone()[0]
        except sqlite3.OperationalError:
            pass
    assert proc.poll() is None, "the eval ended before it could be interrupted"
    if signum == signal.SIGINT:
        os.killpg(proc.pid, signum)
    else:
        proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == status, err
    assert "interrupted; run the same command to resume" in err and "Traceback" not in err, err
    assert err.count("interrupted; run the same command") == 1 and "Event loop is closed" not in err, err
    (run,) = json.loads(ecdysis("runs", "list", "--run-dir", "r", "--json", cwd=tmp_path).stdout)
    assert run["status"] == "interrupted" and run["id"] in err
    assert "interrupted" in ecdysis("runs", "list", "--run-dir", "r", cwd=tmp_path).stdout
    kept = sqlite3.connect(db).execute("SELECT COUNT(*) FROM trajectories").fetchone()[0]
    assert 2 <= kept < 8
    again = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert f"resuming {run['id']}" in again.stderr
    (resumed,) = json.loads(ecdysis("runs", "list", "--run-dir", "r", "--json", cwd=tmp_path).stdout)
    assert resumed["status"] == "finished"
    assert sqlite3.connect(db).execute("SELECT COUNT(*) FROM trajectories").fetchone()[0] == 8


SIGTERM_MID_STEP = """
import asyncio, os, signal, sys, time
from ecdysis.cli.exits import run_async, run_guarded

async def episode(i):
    while True:
        time.sleep(0.01)  # synchronous work inside a task's step, as a model's session release is
        if i == 1 and not sent:
            sent.append(1)
            os.kill(os.getpid(), signal.SIGTERM)  # arrives in this task's step, not in the command's
        await asyncio.sleep(0)

async def command():
    try:
        await asyncio.gather(*(episode(i) for i in range(3)))
    finally:
        await asyncio.sleep(0.05)  # a cleanup that awaits
        print("cleaned up", flush=True)

sent = []
run_guarded(lambda: run_async(command()), debug=False)
"""


def test_sigterm_to_a_background_job_cancels_the_command_not_the_step_it_lands_in(tmp_path: Path) -> None:
    """With SIGINT ignored (a background job), SIGTERM arriving in the middle of some task's step used to raise
    KeyboardInterrupt there: "Task exception was never retrieved" and a traceback after the message. Now the loop
    takes it: the command's task is cancelled, its cleanup runs, one message, exit 143."""
    script = tmp_path / "cmd.py"
    script.write_text(SIGTERM_MID_STEP)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))  # noqa: PLW1509
    assert out.returncode == 143, out.stderr
    assert out.stdout == "cleaned up\n"
    assert out.stderr.strip() == "interrupted", out.stderr


def test_a_finished_compare_leaves_no_run_running(tmp_path: Path, data_dir: Path) -> None:
    assert ecdysis("init", "proj", cwd=tmp_path).returncode == 0
    out = ecdysis("compare", "-c", "proj/ecdysis.toml", "--arms", "fixed", "--transfer-model", "scripted:Answer: 3",
                  "--set", 'agent.model="scripted:Answer: 18"', "--set", "train.train_limit=2", "--set",
                  "train.test_limit=2", "--data-dir", str(data_dir), "--run-dir", "cmp", cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr
    runs = json.loads(ecdysis("runs", "list", "--run-dir", "cmp", "--json", cwd=tmp_path).stdout)
    assert {r["kind"] for r in runs} == {"compare-arm", "transfer"}
    assert {r["status"] for r in runs} == {"finished"}  # the baseline arm's and the transfer run were `running`


def test_a_corrupt_response_cache_is_a_user_error_naming_it(tmp_path: Path) -> None:
    config = jsonl_project(tmp_path)
    (tmp_path / "cache.sqlite").write_bytes(os.urandom(4096))
    out = ecdysis("eval", "-c", str(config), "--model", "scripted:0", "--split", "train", "--run-dir", "r",
                  "--set", f'cache.path="{tmp_path / "cache.sqlite"}"', cwd=tmp_path)
    user_error(out, f"response cache {tmp_path / 'cache.sqlite'} cannot be used", "cache.enabled = false")
