"""Typed evidence: trajectory events read as a discriminated union (old stored events included), failure and
pattern facts and lever effects as records whose predicates are defined once, stored patterns read back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import seed_with, sync_chat

from ecdysis.agent.events import (
    KNOWN,
    ActionEvent,
    ModelEvent,
    PromptEvent,
    ToolErrorEvent,
    UnknownEvent,
    parse_event,
)
from ecdysis.agent.loop import run_episode
from ecdysis.agent.trajectory import Trajectory
from ecdysis.envs import get_environment, make_episode
from ecdysis.envs.base import gold_text
from ecdysis.models import ScriptedModel
from ecdysis.trainer.evidence import FailureFacts, LeverEffect, Pattern, PatternFacts
from ecdysis.trainer.failures import aggregate, failure_record
from ecdysis.trainer.levers import Measurement


def _run(version, task, replies: list[str], tmp_path: Path, env: str) -> Trajectory:  # type: ignore[no-untyped-def]
    version.write(tmp_path / "h")
    traj = Trajectory(task_id=task.id, trial=0, harness_id=version.id)
    episode = make_episode(env, task.public, {})
    run_episode(version, tmp_path / "h", task.public_view(), episode, sync_chat(ScriptedModel(replies)), traj)
    episode.close()
    return traj


def test_every_event_the_loop_writes_is_read_as_its_own_record(tmp_path: Path, data_dir: Path) -> None:
    db = get_environment("dbbench", data_dir=data_dir)
    task = next(t for t in db.tasks("train") if t.meta["type"] == "UPDATE")
    replies = ["Action: Operation\n```sql\nUPDATE `no such table` SET x = 1;\n```", "no action here",
               'Action: Answer\nFinal Answer: ["Error: no such table: no such table"]',
               "Action: Operation\n```sql\n" + task.gold[0] + "\n```", 'Action: Answer\nFinal Answer: ["done"]']
    fixed = _run(seed_with("dbbench", **{"repairs.json": '["error_answer"]'}), task, replies, tmp_path / "a",
                 "dbbench")
    looping = _run(seed_with("dbbench"), task, ["Action: Operation\n```sql\nSELECT 1;\n```"], tmp_path / "b",
                   "dbbench")
    gsm = get_environment("gsm8k", data_dir=data_dir)
    boxed = _run(seed_with("gsm8k", **{"repairs.json": '["boxed_answer"]'}), gsm.tasks("test")[0],
                 ["so \\boxed{7}"], tmp_path / "c", "gsm8k")
    seen = set()
    for traj in (fixed, looping, boxed):
        assert len(traj.typed_events()) == len(traj.events)
        for raw, event in zip(traj.events, traj.typed_events(), strict=True):
            assert type(event) is KNOWN[raw["kind"]] and not event.model_extra, raw  # no field outside its record
            assert event.model_dump(include=set(raw)) == raw
            seen.add(raw["kind"])
    assert seen >= {"prompt", "model", "action", "tool_error", "observation", "repair", "rejection", "annotation",
                    "stop"}
    assert [e.tool for e in fixed.tool_calls()] == ["sql", "sql"]
    assert [e.tool for e in fixed.of(ActionEvent)] == ["sql", "sql", "answer"]
    assert fixed.of(ToolErrorEvent)[0].error == "tool_error"


def test_events_stored_by_older_runs_still_load() -> None:
    stored = {"task_id": "t1", "trial": 0, "harness_id": "h", "termination": "answered", "final_answer": "4",
              "events": [{"kind": "prompt", "turn": 0, "system": "s", "skills": [], "tips": ""},  # no tools yet
                         {"kind": "model", "turn": 0, "messages": [], "reply": "Action: x"},  # no tool_calls, usage
                         {"kind": "action", "turn": 0, "tool": "lookup", "input": "a"},  # no arguments
                         {"kind": "observation", "turn": 0, "text": 42},
                         {"kind": "model", "turn": 1, "messages": [], "reply": "Answer: 4", "tool_calls": None,
                          "finish_reason": "length"},
                         {"kind": "action", "turn": 1, "tool": "answer", "input": "4"}],
              "a_field_of_a_later_version": 1}
    traj = Trajectory.from_dict(stored)
    assert traj.offered_tools() == ["lookup"]  # before tools were stored: the tools it called
    assert traj.replies() == ["Action: x", "Answer: 4"]
    assert traj.reply_records() == [{"text": "Action: x", "tool_calls": []}, {"text": "Answer: 4", "tool_calls": []}]
    assert traj.observations_before_replies() == ["", "42"]
    assert [e.is_tool_call for e in traj.of(ActionEvent)] == [True, False]
    assert [e.truncated for e in traj.of(ModelEvent)] == [False, True]
    assert traj.of(PromptEvent)[0].tools is None
    assert traj.to_dict()["events"] == stored["events"]  # stored as written, never rewritten


def test_unknown_kinds_and_malformed_events_are_kept_not_dropped() -> None:
    noted = parse_event({"kind": "plan", "turn": 2, "steps": ["a", "b"]})  # a free-form loop's session.note
    assert isinstance(noted, UnknownEvent) and noted.kind == "plan" and noted.model_extra == {"steps": ["a", "b"]}
    odd = parse_event({"kind": "model", "turn": "x", "reply": {"not": "text"}})
    assert isinstance(odd, UnknownEvent) and odd.kind == "model" and odd.turn == 0
    assert odd.model_extra == {"reply": {"not": "text"}}


def test_lever_effect_predicates() -> None:
    def effect(**counts: int) -> LeverEffect:
        return LeverEffect(lever="enable_repair x", **counts)

    gains = effect(gained=2)
    assert gains.safe and gains.verified and gains.gains_losing_none and not gains.acts_only_on_failing
    unsure = effect(gained=2, changed_passing=1)  # gains, but a passing episode acts differently
    assert not unsure.safe and not unsure.verified and unsure.gains_losing_none
    changes = effect(changed_failing=3)
    assert changes.acts_only_on_failing and not changes.verified and changes.acts
    loses = effect(gained=3, lost=1, changed_failing=1)
    assert not (loses.safe or loses.verified or loses.acts_only_on_failing or loses.gains_losing_none)
    assert not effect(rescued_replies=0).acts and effect(rescued_replies=2).acts
    assert LeverEffect.model_validate({"lever": "enable_repair a+b"}).repairs == ["a", "b"]  # older records
    m = Measurement(["x"], gained=["t1", "t1", "t2"], lost=[], changed=["t3"], changed_passing=["t9"],
                    rescued={"t1": 2, "t4": 1})
    mine = m.effect({"t1", "t3"})
    assert (mine.gained, mine.changed_failing, mine.rescued_replies, mine.changed_passing) == (1, 1, 2, 1)
    assert not m.safe and m.effect().gained == 2


STORED_PATTERN = {  # as a run stored it before facts were typed (measured levers inside `facts`)
    "id": "P1", "name": "n", "signatures": ["rejected|answer-format|H2|boxed"], "tasks": ["a", "b"], "support": 2,
    "layer": "H2", "classification": "recurring", "reason": "r",
    "facts": {"tasks": 2, "expected_in_reply": 2, "expected_wrapper": {"boxed": 2}, "truncated": 0,
              "answer_parsed": 0, "rules": {"answer-format": 2}, "failures": 2, "tool_failures": {},
              "measured_levers": [{"lever": "enable_repair boxed_answer", "repairs": ["boxed_answer"], "gained": 2,
                                   "lost": 0, "rescued_replies": 2, "changed_failing": 0, "changed_passing": 0,
                                   "model_calls": 0}],
              "answer_set": {"labels": 3, "lost": 0}, "needs_model_calls": ["a higher token limit"],
              "fixable_by": "verified harness lever"},
    "levers": ["l"],
    "evidence": [{"task_id": "a", "last_reply": "\\boxed{1}", "final_answer": None, "expected": "1", "detail": "",
                  "facts": {"shape": "boxed", "truncated": False, "answer_parsed": False, "expected_in_reply": True,
                            "expected_wrapper": "boxed", "tool_errors": 0, "turns": 1, "repairs_used": [],
                            "crash": None, "crash_file": None, "tool_calls": 0, "unknown_tool": 0,
                            "invalid_arguments": 0, "tool_error": 0, "repeated_call": 0, "json_call_in_text": 0,
                            "no_tool_call": 0}}],
}


def test_a_stored_pattern_reads_back_typed_and_stores_the_same() -> None:
    p = Pattern.from_dict(STORED_PATTERN)
    assert isinstance(p.facts, PatternFacts) and isinstance(p.evidence[0].facts, FailureFacts)
    assert p.verified_lever() is not None and p.verified_lever().repairs == ["boxed_answer"]
    assert p.answer_set is not None and p.answer_set.safe and p.fixable_by == "verified harness lever"
    assert p.to_dict() == STORED_PATTERN
    # what the roles read: the observed facts and the answer set, in the order they were always shown
    assert json.dumps(p.prompt_facts()) == (
        '{"tasks": 2, "expected_in_reply": 2, "expected_wrapper": {"boxed": 2}, "truncated": 0, "answer_parsed": 0, '
        '"rules": {"answer-format": 2}, "failures": 2, "tool_failures": {}, "answer_set": {"labels": 3, "lost": 0}}')


def test_failure_facts_and_their_aggregate() -> None:
    traj = Trajectory(task_id="t1", trial=0, harness_id="h", termination="rejected")
    traj.add("model", 0, messages=[], reply="so \\boxed{12}", finish_reason="length")
    traj.add("rejection", 0, feedback="f", rule="answer-format")
    record = failure_record(traj, 12.0)
    assert record.facts.shape == "boxed+truncated" and record.facts.truncated and record.expected == "12"
    assert record.facts.expected_wrapper == "boxed" and record.facts.tool_failure() is None
    (pattern,) = aggregate([record], {"t1": (1, 0)})
    assert pattern.facts.truncated == 1 and pattern.facts.rules == {"answer-format": 1}
    assert pattern.evidence[0].facts == record.facts and pattern.to_dict()["facts"]["failures"] == 1


@pytest.mark.parametrize(("gold", "text"), [(12.0, "12"), (12.5, "12.5"), (7, "7"), ("B", "B"), (True, "True"),
                                            ([1, 2], None), ({"state": 1}, None), (None, None)])
def test_gold_text(gold: object, text: str | None) -> None:
    assert gold_text(gold) == text
