"""Failures are data, and data is shown (issue 35): grader errors and harness crashes are counted by kind with
their first message, `eval`/`train` exit 3 when the grader failed, a harness whose code cannot load is refused
when it is loaded, `show --task` prints one episode turn by turn, `report` covers evaluation runs.
CLI tests run `python -m ecdysis` in a subprocess with scripted models."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import Roles, make_ws

from ecdysis.agent.trajectory import Trajectory
from ecdysis.envs.base import Score, Task
from ecdysis.models import ScriptedModel
from ecdysis.runner.runner import grade_safely, summarize
from ecdysis.store import RunStore
from ecdysis.trainer import train_async

SRC = str(Path(__file__).resolve().parents[1] / "src")
TASKS = [{"id": f"t{i}", "prompt": f"What is {i} plus {i + 1}?", "answer": str(2 * i + 1),
          "split": "train" if i < 4 else "test"} for i in range(6)]
RAISES = "def grade(answer, gold):\n    return gold['value'] == answer\n"  # gold is a str: TypeError
RETURNS_YES = "def grade(answer, gold):\n    return 'yes'\n"
ONE_ARGUMENT = "def grade(answer):\n    return 1.0\n"
FIXED = "def grade(answer, gold):\n    return (answer or '').strip() == str(gold)\n"
CRASHING_ACTION = ("from ecdysis.harness.api import answer\n\n"
                   "def helper(x):\n    return x['missing']\n\n"
                   "def realize(reply, ctx):\n    return helper({})\n")


def cli(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`ecdysis ARGS` as a new user runs it (this checkout's code, no ECDYSIS_* variables, a fresh HOME)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ECDYSIS_")}
    env |= {"HOME": str(cwd), "COLUMNS": "200", "PYTHONPATH": SRC}
    return subprocess.run([sys.executable, "-m", "ecdysis", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)


def suite(tmp_path: Path, grader: str) -> list[str]:
    """tasks.jsonl and grade.py in `tmp_path`; the eval arguments for them (4 train tasks, scripted replies)."""
    (tmp_path / "tasks.jsonl").write_text("\n".join(json.dumps(t) for t in TASKS) + "\n")
    (tmp_path / "grade.py").write_text(grader)
    return ["eval", "--env", "jsonl", "--tasks", "tasks.jsonl", "--grader", "grade.py:grade", "--split", "train",
            "--model", "scripted:Answer: 3"]


# --- grader errors --------------------------------------------------------------------------------------------

def test_each_grader_failure_is_refused_or_exits_3_naming_it(tmp_path: Path) -> None:
    args = suite(tmp_path, RAISES)
    out = cli(*args, "--run-dir", "r1", cwd=tmp_path)
    assert out.returncode == 3, out.stdout + out.stderr
    assert "grader_error" in out.stdout and "accuracy" in out.stdout
    assert "the grader failed on 4 of 4 episode(s)" in out.stderr
    assert "raised TypeError: string indices must be integers" in out.stderr

    (tmp_path / "grade.py").write_text(RETURNS_YES)
    out = cli(*args, "--run-dir", "r2", "--json", cwd=tmp_path)
    assert out.returncode == 3, out.stderr
    (failure,) = json.loads(out.stdout)["failures"]  # --json carries the counts too
    assert failure["kind"] == "grader_error" and failure["count"] == 4
    assert "returned str 'yes'; a grader returns a number or a bool" in failure["message"]
    assert "returned str 'yes'" in out.stderr

    (tmp_path / "grade.py").write_text(ONE_ARGUMENT)  # refused when loaded: nothing runs
    out = cli(*args, "--run-dir", "r3", cwd=tmp_path)
    assert out.returncode == 2 and "grade(answer) cannot be called as grade(answer, gold)" in out.stderr
    assert not (tmp_path / "r3").exists()

    (tmp_path / "grade.py").write_text(FIXED)
    out = cli(*args, "--run-dir", "r4", "--set", "env.options.tolerance=x", cwd=tmp_path)
    assert out.returncode == 2 and "env.options.tolerance should be a number >= 0" in out.stderr and "'x'" in out.stderr

    out = cli(*args, "--run-dir", "r5", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "grader_error" not in out.stdout and "the grader failed" not in out.stderr


def test_a_fixed_module_grader_regrades_the_stored_episodes_without_model_calls(tmp_path: Path) -> None:
    args = suite(tmp_path, RAISES)
    (tmp_path / "mygrader.py").write_text(RAISES)
    args[args.index("grade.py:grade")] = "mygrader:grade"  # the run id does not hash a module's content
    out = cli(*args, "--run-dir", "r", cwd=tmp_path)
    assert out.returncode == 3, out.stderr
    (tmp_path / "mygrader.py").write_text(FIXED)
    again = cli(*args, "--run-dir", "r", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "resuming eval-" in again.stderr and "grader_error" not in again.stdout
    store = RunStore(tmp_path / "r")
    (run,) = store.runs()
    assert sum(row["calls"] for row in store.call_totals(run["id"])) == 4  # the first invocation's only
    (evaluation,) = store.evaluations(run["id"])
    scores = {t.task_id: t.score for t in store.trajectories(evaluation["id"])}
    assert scores == {"t0": 0.0, "t1": 1.0, "t2": 0.0, "t3": 0.0}  # "3" is right for 1 + 2 only


class _OddEnv:
    name = "odd"
    tool_names = ()

    def __init__(self, result: Any) -> None:
        self.result = result

    def grade(self, task: Task, answer: str | None, final_state: dict[str, Any]) -> Any:
        return self.result


def test_grade_safely_counts_a_non_score_or_a_non_number_as_a_grader_error() -> None:
    task, traj = Task("a", "train", "q", "1"), Trajectory("a", 0, "h", final_answer="1", termination="answered")
    for result, needle in (("yes", "returned str 'yes', not a Score"), (1.0, "returned float 1.0, not a Score"),
                           (Score(math.nan, False), "score value nan"), (Score("1", True), "score value '1'")):
        score = grade_safely(_OddEnv(result), task, traj)  # type: ignore[arg-type]
        assert score.value == 0.0 and not score.passed and needle in score.detail
        assert score.components == {"grader_error": score.detail}
    assert grade_safely(_OddEnv(Score(0.5, False, "half")), task, traj) == Score(0.5, False, "half")  # type: ignore[arg-type]


def test_summaries_count_every_failure_kind_with_its_first_message() -> None:
    from ecdysis.runner.failures import EXIT_GRADER_FAILED, FailureKind  # new API (imported here: the CLI tests
    # above run against any version)

    assert EXIT_GRADER_FAILED == 3

    def traj(task: str, termination: str, traceback: str | None = None, **kw: Any) -> Trajectory:
        return Trajectory(task, 0, "h", termination=termination, traceback=traceback, **kw)

    crash_tb = ('Traceback (most recent call last):\n  File "/sandbox/harness/action.py", line 4, in realize\n'
                "    return x['missing']\nKeyError: 'missing'\n")
    recorded = [traj("a", "crash", crash_tb), traj("b", "crash", "RuntimeError: later"),
                traj("c", "timeout", "task exceeded its 5s time limit"), traj("d", "model_error", "ModelError: 500"),
                traj("e", "max_turns", model_calls=3), traj("f", "infra_error", "lost by the infrastructure"),
                traj("g", "answered", score_detail="grader g raised KeyError: 'x'",
                     score_components={"grader_error": "grader g raised KeyError: 'x'"}),
                traj("h", "answered", score=0.0)]  # a wrong answer: not a failure kind
    s = summarize("e", "h", "train", 1, recorded, 1.0)
    assert [c.kind for c in s.failures.kinds] == list(FailureKind)
    assert s.failures.of(FailureKind.HARNESS_CRASH) == 2 and s.failures.grader_errors == 1
    crash = s.failures.first(FailureKind.HARNESS_CRASH)
    assert crash is not None and crash.task_id == "a" and crash.message == "KeyError: 'missing' (action.py, line 4)"
    assert "return x['missing']" in crash.traceback
    assert s.failures.first(FailureKind.TIMEOUT).message == "task exceeded its 5s time limit"  # type: ignore[union-attr]
    assert "turn budget ran out" in s.failures.first(FailureKind.BUDGET_STOP).message  # type: ignore[union-attr]
    assert s.to_dict()["failures"][0] == {"kind": "grader_error", "count": 1, "task_id": "g", "trial": 0,
                                          "message": "grader g raised KeyError: 'x'", "traceback": ""}
    json.dumps(s.to_dict())  # stored as the evaluation's summary


async def test_train_refuses_a_split_whose_failures_are_grader_errors_before_any_role_call(tmp_path: Path) -> None:
    (tmp_path / "grade.py").write_text(RAISES)
    roles = Roles()
    ws = make_ws(tmp_path, roles, ScriptedModel(lambda m: "so \\boxed{7}", name="sevens"), "train.rounds=2",
                 f'env.options.grader="{tmp_path / "grade.py"}:grade"')
    with pytest.raises(Exception) as refused:  # noqa: PT011 - its type is checked below (new in issue 35)
        await train_async(ws.config, "ecdysis", ws=ws)
    assert type(refused.value).__name__ == "GraderFailed"
    assert refused.value.split == "train" and refused.value.failures.grader_errors == 6  # type: ignore[attr-defined]
    assert "training stops here instead of diagnosing them" in str(refused.value)
    assert roles.calls == []  # no role was asked to "fix" a grading bug
    (run,) = ws.store.runs()
    assert run["status"] == "grader_failed" and ws.store.get_record(run["id"], "patterns", "r1") is None
    assert {row["role"] for row in ws.store.call_totals(run["id"])} == {"agent"}


# --- harness crashes and harness code that cannot load ----------------------------------------------------------

def test_harness_crashes_are_shown_and_code_that_cannot_load_is_refused(tmp_path: Path) -> None:
    args = suite(tmp_path, FIXED)
    assert cli("init", "proj", "--env", "jsonl", "--tasks", "tasks.jsonl", cwd=tmp_path).returncode == 0
    action = tmp_path / "proj" / "harness" / "action.py"
    action.write_text("def parse(reply, ctx):\n    return None\n")
    out = cli(*args, "--harness", "proj/harness", "--run-dir", "r", cwd=tmp_path)
    assert out.returncode == 2 and not (tmp_path / "r").exists()
    assert "proj/harness/action.py: defines no function realize(); the action layer needs `def realize(reply, ctx)`" \
        in out.stderr
    action.write_text("import numpyy\n\ndef realize(reply, ctx):\n    return None\n")
    out = cli(*args, "--harness", "proj/harness", "--run-dir", "r", cwd=tmp_path)
    assert out.returncode == 2 and not (tmp_path / "r").exists()
    assert ("proj/harness: harness code failed to load: action.py failed to import (line 1): ModuleNotFoundError: "
            "No module named 'numpyy'") in out.stderr

    action.write_text(CRASHING_ACTION)
    out = cli(*args, "--harness", "proj/harness", "--run-dir", "r", cwd=tmp_path)
    assert out.returncode == 0, out.stderr  # crashes are the harness's result, shown, not an error of the tool
    assert "harness_crash" in out.stdout and "t0: KeyError: 'missing' (action.py, line 4)" in out.stdout
    assert "first harness crash (task t0, trial 0):" in out.stdout and "return x['missing']" in out.stdout
    run_id = json.loads(cli("runs", "list", "--run-dir", "r", "--json", cwd=tmp_path).stdout)[0]["id"]
    assert f"`ecdysis show {run_id} --run-dir r --task t0`" in out.stdout

    # `show` lists the failures by kind; `show --task` prints the episode turn by turn
    shown = cli("show", "--run-dir", "r", cwd=tmp_path)
    assert shown.returncode == 0 and "harness_crash=4" in shown.stdout and "Failures by kind" in shown.stdout
    assert json.loads(cli("show", "--run-dir", "r", "--json", cwd=tmp_path).stdout)["evaluations"][0][
        "failures"][0]["kind"] == "harness_crash"
    episode = cli("show", run_id, "--run-dir", "r", "--task", "t1", cwd=tmp_path)
    assert episode.returncode == 0, episode.stderr
    text = episode.stdout
    for needle in ("Episode task t1, trial 0", "termination crash", "system prompt", "What is 1 plus 2?",
                   "turn 0 · model", "Answer: 3", "exception", "KeyError: 'missing'", "return helper({})",
                   "grade 0.000 (failed): grader grade.py:grade gave 0",
                   "failure harness_crash: KeyError: 'missing' (action.py, line 4)"):
        assert needle in text, needle
    assert text.index("turn 0 · model") < text.index("exception") < text.index("grade 0.000")
    data = json.loads(cli("show", run_id, "--run-dir", "r", "--task", "t1", "--json", cwd=tmp_path).stdout)
    assert data["task_id"] == "t1" and data["trial"] == 0 and data["trials"] == [0]
    assert data["failures"] == [{"kind": "harness_crash", "message": "KeyError: 'missing' (action.py, line 4)"}]
    assert data["traceback_tail"].endswith("KeyError: 'missing'") and data["grade"]["grader_error"] is None
    assert [e["kind"] for e in data["trajectory"]["events"]] == ["prompt", "model"]
    missing = cli("show", run_id, "--run-dir", "r", "--task", "t9", cwd=tmp_path)
    assert missing.returncode == 2 and "task 't9' did not run in" in missing.stderr
    missing = cli("show", run_id, "--run-dir", "r", "--task", "t1", "--trial", "2", cwd=tmp_path)
    assert missing.returncode == 2 and "has no trial 2" in missing.stderr and "recorded trials: 0" in missing.stderr

    # `report` of an evaluation run (the directory holds no training run)
    made = cli("report", "--run-dir", "r", "-o", "eval.html", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    html = (tmp_path / "eval.html").read_text()
    assert f"Evaluation report <code>{run_id}</code>" in html and "harness_crash" in html
    assert "KeyError: &#39;missing&#39; (action.py, line 4)" in html and html.count('class="episode"') == 4
    assert "What is 1 plus 2?" in html  # the episodes, turn by turn


# --- the newcomer path ------------------------------------------------------------------------------------------

def test_newcomer_path_broken_grader_then_fixed_then_train_then_show_task(tmp_path: Path) -> None:
    (tmp_path / "tasks.jsonl").write_text("\n".join(json.dumps(t) for t in TASKS) + "\n")
    (tmp_path / "grade.py").write_text(RAISES)
    made = cli("init", "proj", "--env", "jsonl", "--tasks", "tasks.jsonl", "--grader", "grade.py:grade", cwd=tmp_path)
    assert made.returncode == 0, made.stderr  # the grader loads: its bug shows only when it grades
    agent = ["--model", "scripted:The sum is \\boxed{3}"]
    out = cli("eval", "-c", "proj/ecdysis.toml", *agent, "--split", "train", "--run-dir", "runs", cwd=tmp_path)
    assert out.returncode == 3 and "the grader failed on 4 of 4 episode(s)" in out.stderr
    assert "grader_error" in out.stdout and "raised TypeError" in out.stdout
    spec = json.dumps({"patterns_addressed": ["P1"], "changes": [{"layer": "H2", "kind": "enable_repair",
                       "repair": "boxed_answer", "rationale": "replies end in boxed"}]})
    train = ["train", "-c", "proj/ecdysis.toml", *agent, "--roles-model", f"scripted:{spec}", "--rounds", "1",
             "--run-dir", "runs"]
    out = cli(*train, cwd=tmp_path)
    assert out.returncode == 3 and "training stops here instead of diagnosing them" in out.stderr
    (tmp_path / "grade.py").write_text(FIXED)
    out = cli(*train, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    runs = json.loads(cli("runs", "list", "--run-dir", "runs", "--json", cwd=tmp_path).stdout)
    train_run = next(r["id"] for r in runs if r["kind"] == "train" and r["status"] == "finished")
    episode = cli("show", train_run, "--run-dir", "runs", "--task", "t1", "--eval", "train", cwd=tmp_path)
    assert episode.returncode == 0, episode.stderr
    assert "Episode task t1, trial 0" in episode.stdout and "The sum is \\boxed{3}" in episode.stdout
    assert "grade 1.000 (passed): grader " in episode.stdout and "grade.py:grade gave 1" in episode.stdout
