"""Levers for model-level failures (issue 24): retrieved labelled examples (train split only, leak-checked),
the answer-set constraint measured exactly by replay, confusion facts, self-consistency votes."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
from helpers import seed_files, sync_chat, write_seed

from ecdysis.agent.loop import run_episode
from ecdysis.agent.trajectory import Trajectory
from ecdysis.config import load_config
from ecdysis.envs.base import NoToolEpisode, Task
from ecdysis.harness.manifest import version_from_files
from ecdysis.harness.skills import example_messages, nearest_examples, parse_examples
from ecdysis.models import Message, ScriptedModel
from ecdysis.trainer.checks import CheckFailed, check_static
from ecdysis.trainer.demos import examples_file
from ecdysis.trainer.evidence import Confusion, LabelErrors
from ecdysis.trainer.failures import aggregate, confusion_facts, failure_record
from ecdysis.trainer.implement import apply_structured
from ecdysis.trainer.levers import Measurement, measure_repairs
from ecdysis.trainer.spec import Change, HarnessSpec
from ecdysis.workspace import Workspace

LABELS = ["sports", "politics", "science", "music"]
ROWS = [("The striker scored twice in the final", "sports", "train"),
        ("The goalkeeper saved a penalty in the cup final", "sports", "test"),
        ("Parliament passed the budget vote", "politics", "train"),
        ("The senator lost the election vote", "politics", "val"),
        ("Astronomers found water on a distant planet", "science", "train"),
        ("The band released a new album of songs", "music", "train"),
        ("The orchestra played songs from the album", "music", "val"),
        ("A recipe for bread and cake", "music", "train")]


def tasks() -> list[Task]:
    return [Task(id=f"t{i}", split=split, prompt=prompt, gold=gold, public={"choices": LABELS})
            for i, (prompt, gold, split) in enumerate(ROWS)]


def jsonl_harness() -> object:
    return version_from_files(seed_files("jsonl"), origin="test")


def test_retrieval_picks_the_nearest_training_tasks_and_never_a_val_or_test_task() -> None:
    everything = {t.id: t for t in tasks()}
    text = examples_file(everything, [], k=2)  # the caller passed val/test tasks too: only train ones are kept
    assert text is not None
    examples = parse_examples(text)
    prompts = {p for p, _ in examples.items}
    assert prompts == {t.prompt for t in tasks() if t.split == "train"}
    nearest = nearest_examples(examples, "Who scored in the cup final?")
    assert nearest[0] == ("The striker scored twice in the final", "sports")
    own = nearest_examples(examples, "Parliament passed the budget vote")  # a training task never sees itself
    assert all(p != "Parliament passed the budget vote" for p, _ in own)
    messages = example_messages(text, "Who scored in the cup final?")
    assert messages[-2:] == [{"role": "user", "content": "The striker scored twice in the final"},
                             {"role": "assistant", "content": "Answer: sports"}]

    harness = jsonl_harness()
    train = [t for t in tasks() if t.split == "train"]
    spec = HarnessSpec(patterns_addressed=["P1"], changes=[Change(layer="H5", kind="add_examples", value=2)])
    files, notes = apply_structured(harness, spec, [], everything)
    assert "examples.json" in files and "2 per task from 5 training tasks" in notes[0]
    assert check_static(harness, files, train).layer_text("examples") == files["examples.json"]
    leaked = json.loads(files["examples.json"])
    leaked["examples"].append({"prompt": ROWS[3][0], "answer": "politics"})  # a val task
    with pytest.raises(CheckFailed, match="not a training task"):
        check_static(harness, {**files, "examples.json": json.dumps(leaked)}, train)
    wrong = json.loads(files["examples.json"])
    wrong["examples"][0]["answer"] = "music"
    with pytest.raises(CheckFailed, match="gold answer"):
        check_static(harness, {**files, "examples.json": json.dumps(wrong)}, train)


def test_retrieval_matches_texts_of_one_script_that_share_no_letter() -> None:
    greek, cyrillic, hiragana = "\u03b1\u03b2\u03b3", "\u0434\u0436\u0437", "\u3042\u3044\u3046"
    text = json.dumps({"k": 1, "examples": [{"prompt": f"Which script: {cyrillic}", "answer": "Cyrillic"},
                                            {"prompt": f"Which script: {hiragana}", "answer": "Hiragana"},
                                            {"prompt": f"Which script: {greek}", "answer": "Greek"}]})
    assert nearest_examples(parse_examples(text), "Which script: \u03b4\u03b5\u03b6") == [
        (f"Which script: {greek}", "Greek")]
    assert nearest_examples(parse_examples(text), "Which script: \u304b\u304d") == [
        (f"Which script: {hiragana}", "Hiragana")]


def labeller(messages: list[Message]) -> str:
    """Answers a label with extra words for sports and science ('sports news'), a bare label otherwise."""
    text = next(m.content for m in messages if m.role == "user").lower()
    if "final" in text or "scored" in text:
        return "Answer: Sports news"
    if "planet" in text:
        return "Answer: it is science."
    if "recipe" in text:
        return "Answer: cooking"  # names no allowed answer: the constraint asks again
    return "Answer: politics" if "vote" in text else "Answer: music"


def measured_then_live(tmp_path: Path, rows: list[tuple[str, str, str, str]], agent: ScriptedModel, repair: str,
                       *options: str) -> tuple[list[Task], Measurement, set[str], set[str]]:
    """A jsonl suite of `rows` (id, prompt, gold, split; graded `exact`, plus `options`) answered by `agent`
    through the seed harness: its training tasks, the replay measurement of `repair` over the seed's training
    episodes, and the training tasks the seed passes live, then with `repair` enabled."""
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(json.dumps({"id": i, "prompt": p, "answer": g, "split": s}) for i, p, g, s in rows))
    harness = write_seed(tmp_path / "seed", "jsonl")
    cfg = load_config(None, ['env.name="jsonl"', f'env.options.path="{path}"', 'env.options.grader="exact"',
                             *options, f'agent.harness="{harness}"', "run.progress=false",
                             'agent.model="scripted:agent"', f'run.run_dir="{tmp_path / "run"}"',
                             f'cache.path="{tmp_path / "c.sqlite"}"'])
    ws = Workspace.open(cfg)
    ws.backends["agent|scripted:agent"] = agent
    train = ws.tasks("train", None)
    runner = ws.runner(ws.store.start_run("eval", {}, run_id="e"))
    seed = ws.harness()

    def passed(candidate: object, label: str) -> tuple[str, set[str]]:
        done = asyncio.run(runner.evaluate(candidate, train, 1, "train", label))
        return done.eval_id, {t.task_id for t in ws.store.trajectories(done.eval_id) if t.passed}

    before_id, before = passed(seed, "before")
    measured = asyncio.run(measure_repairs(seed, ws.store.trajectories(before_id), ws.env,
                                           {t.id: t for t in train}, runner.limits))
    _, after = passed(seed.with_files({"repairs.json": json.dumps([repair])}), "after")
    return train, next(m for m in measured if m.repairs == [repair]), before, after


def test_answer_set_constraint_replays_exactly(tmp_path: Path) -> None:
    rows = [(f"t{i}", p, g, s) for i, (p, g, s) in enumerate(ROWS)]
    train, answer_set, before, after = measured_then_live(tmp_path, rows, ScriptedModel(labeller), "answer_set",
                                                          f"env.options.labels={json.dumps(LABELS)}")
    assert train[0].public["choices"] == LABELS
    assert set(answer_set.gained) == after - before == {"t0", "t4"} and not answer_set.lost  # replay == live
    assert answer_set.changed == ["t7"]  # rejected with rejections to spare: its next reply is unknown, not a fail


AMOUNTS = [("How many bottles in 30 crates of 1000?", "30000", "Answer: 30,000"),
           ("What do 4 tickets at $300 cost?", "1200", "Answer: $1,200"),
           ("How many apples are left?", "12 apples", "Answer: 12 apples"),  # the gold keeps its unit
           ("What is 3 + 4?", "7", "Answer: 7"),
           ("What is 900 + 600?", "1500", "Answer: 1,400")]  # wrong either way


def test_plain_number_is_measured_by_replay_with_its_gains_and_its_losses(tmp_path: Path) -> None:
    """A formatted number ('30,000' for the gold '30000') is a harness-level failure the replay finds: the
    repair gains those tasks, and loses the one whose gold keeps its unit; a live run agrees with the replay."""
    replies = {p: r for p, _, r in AMOUNTS}
    agent = ScriptedModel(lambda messages: next(r for p, r in replies.items() if any(p in m.content for m in messages)))
    rows = [(f"n{i}", p, g, "train") for i, (p, g, _) in enumerate(AMOUNTS)]
    _, plain, before, after = measured_then_live(tmp_path, rows, agent, "plain_number")
    assert sorted(plain.gained) == ["n0", "n1"] and plain.lost == ["n2"]
    assert not plain.safe  # a passing task is lost: the library does not enable it blindly
    assert after - before == set(plain.gained) and before - after == set(plain.lost)  # replay == live


def test_answer_set_maps_or_rejects_with_the_allowed_answers() -> None:
    from ecdysis.harness.api import answer
    from ecdysis.harness.repairs import answer_set

    assert answer_set(answer("SPORTS."), tuple(LABELS)) == answer("sports")
    assert answer_set(answer("I think music"), tuple(LABELS)) == answer("music")
    assert answer_set(answer("scince"), tuple(LABELS)) == answer("science")
    rejected = answer_set(answer("cooking"), tuple(LABELS))
    assert rejected.rule == "answer-set" and "sports, politics, science, music" in rejected.feedback
    assert answer_set(answer("music"), tuple(LABELS)) is None


def _failure(task_id: str, expected: str, given: str) -> object:
    traj = Trajectory(task_id=task_id, trial=0, harness_id="h", final_answer=given, termination="answered")
    traj.add("model", 0, reply=f"Answer: {given}", messages=[])
    return failure_record(traj, expected)


def test_confusion_facts_on_known_failures() -> None:
    records = [_failure("a", "politics", "science"), _failure("b", "politics", "science"),
               _failure("c", "music", "sports"), _failure("d", "politics", "music")]
    facts = confusion_facts(records, {"a": "politics", "b": "politics", "c": "music", "d": "politics",
                                      "e": "music", "f": "sports"})
    assert facts is not None
    confusions, label_errors = facts
    assert confusions[0] == Confusion(expected="politics", given="science", n=2)
    assert label_errors["politics"] == LabelErrors(errors=3, tasks=3)
    assert label_errors["music"] == LabelErrors(errors=1, tasks=2)
    (pattern,) = aggregate(records, {k: (1, 0) for k in "abcd"})
    assert pattern.confusions[0].given == "science" and pattern.layer == "model"


def test_self_consistency_takes_the_majority_answer(tmp_path: Path) -> None:
    files = seed_files("jsonl")
    files["harness.toml"] = files["harness.toml"].replace("[generation]", "[generation]\nsamples = 3")
    version = version_from_files(files, origin="test")
    version.write(tmp_path / "h")

    answers = iter(["Answer: science", "Answer: politics", "Answer: Politics."])
    model = ScriptedModel(lambda messages: next(answers))
    traj = Trajectory(task_id="t", trial=0, harness_id=version.id)
    task = tasks()[2]
    run_episode(version, tmp_path / "h", task.public_view(), NoToolEpisode(), sync_chat(model), traj)
    assert len(model.calls) == 3 and traj.final_answer == "politics"
    vote = traj.of_kind("vote")[0]
    assert vote["votes"] == 2 and vote["chosen"] == 1
    assert [r["text"] for r in traj.reply_records()] == ["Answer: politics"]  # the replay record: chosen only
    assert [c.params.temperature for c in model.calls][1:] == [0.7, 0.7]
    assert re.search(r"sample_index", str(model.calls[1].params)) is not None
