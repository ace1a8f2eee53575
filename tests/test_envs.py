"""Environments on the real task files: ids, splits, grading of every DBBench task type, bad files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ecdysis.envs import TaskFileError, UnknownEnvironmentError, get_environment, seeded_order
from ecdysis.envs.dbbench import SQLEpisode
from ecdysis.envs.gsm8k import parse_number, run_python
from ecdysis.harness.api import Action


def test_gsm8k_ids_are_stable_and_splits_disjoint(data_dir: Path) -> None:
    env = get_environment("gsm8k", data_dir=data_dir)
    train, val, test = (env.tasks(s) for s in ("train", "val", "test"))
    assert len(test) == 1319 and len(train) + len(val) == 7473
    assert {t.id for t in train}.isdisjoint({t.id for t in val})
    again = get_environment("gsm8k", data_dir=data_dir).tasks("test")
    assert [t.id for t in seeded_order(test, 0)[:5]] == [t.id for t in seeded_order(again, 0)[:5]]
    assert [t.id for t in seeded_order(test, 0)[:5]] != [t.id for t in seeded_order(test, 1)[:5]]
    assert set(test[0].public_view()) == {"id", "prompt", "public", "conversational"}  # gold stays in the host


def test_gsm8k_grading(data_dir: Path) -> None:
    env = get_environment("gsm8k", data_dir=data_dir)
    task = next(t for t in env.tasks("test") if t.gold == 18)
    assert env.grade(task, "18", {}).passed
    assert env.grade(task, "$18.00", {}).passed
    assert not env.grade(task, "17", {}).passed
    assert not env.grade(task, None, {}).passed
    assert parse_number("a 1,234.5 b") == 1234.5
    assert run_python("print(6*7)") == "42"
    assert "ZeroDivisionError" in run_python("1/0")


def _first_of_type(tasks, kind):  # type: ignore[no-untyped-def]
    return next(t for t in tasks if t.meta["type"] == kind)


QUERY_TYPES = ["other", "comparison", "counting", "ranking", "aggregation-SUM", "aggregation-MAX",
               "aggregation-MIN", "aggregation-AVG"]


@pytest.mark.parametrize("kind", QUERY_TYPES)
def test_dbbench_query_types_graded_against_label(data_dir: Path, kind: str) -> None:
    env = get_environment("dbbench", data_dir=data_dir)
    task = _first_of_type(env.tasks("test"), kind)
    assert env.grade(task, json.dumps(task.gold), {}).passed
    assert env.grade(task, " , ".join(str(x) for x in task.gold), {}).passed or len(task.gold) != 1
    assert not env.grade(task, json.dumps(["definitely not it"]), {}).passed
    assert not env.grade(task, None, {}).passed


@pytest.mark.parametrize("kind", ["INSERT", "UPDATE"])
def test_dbbench_mutations_graded_by_final_table(data_dir: Path, kind: str) -> None:
    env = get_environment("dbbench", data_dir=data_dir)
    task = _first_of_type(env.tasks("train"), kind)
    untouched = SQLEpisode(task.public)
    assert not env.grade(task, "done", untouched.final_state()).passed
    untouched.close()
    episode = SQLEpisode(task.public)
    for statement in task.gold:
        assert not episode.step(Action("sql", statement)).startswith("Error")
    assert env.grade(task, "done", episode.final_state()).passed
    episode.close()


def test_dbbench_episode_truncates_and_reports_errors(data_dir: Path) -> None:
    env = get_environment("dbbench", data_dir=data_dir)
    task = env.tasks("train")[0]
    episode = SQLEpisode(task.public)
    assert episode.step(Action("sql", "SELEC nonsense")).startswith("Error:")
    table = task.public["table_name"]
    out = episode.step(Action("sql", f'SELECT * FROM "{table}"'))
    assert out.startswith("[(") and len(out) <= 1600
    episode.close()


def test_malformed_task_line_names_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "gsm8k").mkdir()
    path = tmp_path / "gsm8k" / "test.jsonl"
    path.write_text('{"question": "1+1?", "answer": "#### 2"}\n{"question": "2+2?", "answer": \n')
    env = get_environment("gsm8k", data_dir=tmp_path)
    with pytest.raises(TaskFileError, match=r"test\.jsonl:2: not valid JSON"):
        env.tasks("test")
    path.write_text('{"question": "1+1?"}\n')
    with pytest.raises(TaskFileError, match=r"test\.jsonl:1: missing field 'answer'"):
        env.tasks("test")


def test_jsonl_suite_with_user_grader(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    rows = [{"id": f"t{i}", "prompt": f"say {i}", "answer": str(i), "split": "test"} for i in range(3)]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    (tmp_path / "doubling.py").write_text("def grade(answer, gold):\n    return answer == str(2 * int(gold))\n")
    env = get_environment("jsonl", path=path, grader="doubling.py:grade", search=[tmp_path])
    tasks = env.tasks("test")
    assert [t.id for t in tasks] == ["t0", "t1", "t2"]
    assert env.grade(tasks[1], "2", {}).passed and not env.grade(tasks[1], "1", {}).passed  # the user's rule
    default = get_environment("jsonl", path=path)
    assert default.grade(tasks[1], " 1 ", {}).passed and not default.grade(tasks[1], "2", {}).passed
    path.write_text(json.dumps({"id": "a", "prompt": "x", "answer": 1}) + "\n"
                    + json.dumps({"id": "a", "prompt": "y", "answer": 2}))
    with pytest.raises(TaskFileError, match="duplicate id"):
        env.tasks("train")


def test_unknown_environment() -> None:
    with pytest.raises(UnknownEnvironmentError, match="built-in name .gsm8k, dbbench, jsonl"):
        get_environment("webshop")


def test_limit_is_stratified_by_task_kind() -> None:
    from collections import Counter

    from ecdysis.envs.base import Task, seeded_order

    tasks = [Task(id=f"a{i}", split="test", prompt="", gold="", meta={"type": "a"}) for i in range(9)] + [
        Task(id=f"b{i}", split="test", prompt="", gold="", meta={"type": "b"}) for i in range(3)]
    first = seeded_order(tasks, 0)[:6]
    assert Counter(t.meta["type"] for t in first) == {"a": 3, "b": 3}
    assert seeded_order(tasks, 0) == seeded_order(list(reversed(tasks)), 0)  # deterministic
    plain = [Task(id=f"p{i}", split="test", prompt="", gold="") for i in range(5)]
    assert seeded_order(plain, 1) == sorted(seeded_order(plain, 1), key=lambda t: seeded_order(plain, 1).index(t))


def test_a_plugin_imported_from_a_removed_folder_is_imported_again_from_the_configured_one(tmp_path: Path) -> None:
    import shutil
    import sys

    from ecdysis.envs import import_module

    first, second = tmp_path / "first", tmp_path / "second"
    for folder, marker in ((first, "first"), (second, "second")):
        folder.mkdir()
        (folder / "moving_plugin_env.py").write_text(f"WHERE = {marker!r}\n")
    try:
        assert import_module("moving_plugin_env:environment", [first]).WHERE == "first"
        shutil.rmtree(first)
        assert import_module("moving_plugin_env:environment", [second]).WHERE == "second"
        assert import_module("moving_plugin_env:environment", [second]).WHERE == "second"  # kept once right
    finally:
        sys.modules.pop("moving_plugin_env", None)
        for folder in (first, second):
            if str(folder) in sys.path:
                sys.path.remove(str(folder))
