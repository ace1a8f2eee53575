"""Grounded diagnosis with scripted roles: measured levers, specs sent back for ignoring them, rules
about harness internals refused, and a library-proposed demonstration tested by acceptance."""

from __future__ import annotations

import json
import re

import pytest
from helpers import Roles, make_ws, seed_with

from ecdysis.models import Message, ScriptedModel
from ecdysis.trainer import train_async
from ecdysis.trainer.spec import SpecError, parse_spec

RULE_SPEC = {"patterns_addressed": ["P1"], "changes": [
    {"layer": "H3", "kind": "add_rule", "file": "", "text": "Show your work.", "repair": "", "value": 0,
     "rationale": "more care"}], "skills": [], "implementation_notes": "", "expected_effect": "better answers"}
DEBATE_ALWAYS = "train.engine.skip_debate_when_verified=false"  # these tests are about the debate's specs
DEMO_SPEC = {"patterns_addressed": ["P1"], "changes": [
    {"layer": "H5", "kind": "add_demo", "file": "", "text": "a worked example", "repair": "", "value": 0,
     "rationale": "P1 is a model-level error; show one solved task"}],
    "skills": [], "implementation_notes": "", "expected_effect": "right answers"}


def numbers(messages: list[Message]) -> tuple[int, int]:
    a, b = map(int, re.findall(r"\d+", messages[-1].content)[:2])
    return a, b


def prose(messages: list[Message]) -> str:
    a, b = numbers(messages)
    return f"Adding {a} and {b} carefully, the answer is {a + b}."


async def test_prose_rejections_get_a_measured_repair_and_a_spec_ignoring_it_is_sent_back(tmp_path) -> None:
    roles = Roles(spec=RULE_SPEC)
    ws = make_ws(tmp_path, roles, ScriptedModel(prose, name="prose"), "train.rounds=1", DEBATE_ALWAYS)
    result = await train_async(ws.config, "ecdysis", ws=ws)
    (p1, *_) = ws.store.get_record(result.run_id, "patterns", "r1")
    assert p1["id"] == "P1" and p1["classification"] == "recurring"
    assert p1["facts"]["fixable_by"] == "verified harness lever"
    measured = {m["lever"]: m for m in p1["facts"]["measured_levers"]}
    phrase = measured["enable_repair answer_phrase"]
    assert phrase["gained"] == 6 and phrase["lost"] == 0
    assert "enable_repair boxed_answer" not in measured  # replayed: no box in any reply, so no gain, not listed
    runs = ws.store.records(result.run_id, "measurements")[0][1]
    assert {m["lever"] for m in runs} >= {"enable_repair answer_phrase", "enable_repair boxed_answer"}
    assert all(m["lost"] == [] for m in runs if m["lever"] == "enable_repair answer_phrase")
    assert roles.calls[6:] == ["MODERATOR", "SINGLE"]  # the rule-only spec was sent back once (repair prompt)
    assert transcript_added(ws, result.run_id) == ["enable_repair answer_phrase for P1"]  # still ignored: added
    final = ws.store.load_version(result.final_harness_id)
    assert "answer_phrase" in final.files.get("repairs.json", "") and result.train_after == 1.0
    transcript = ws.store.get_record(result.run_id, "transcript", "r1")
    assert transcript[-1]["role"] == "moderator"
    prompts = [m for m in ws.backends["moderator|scripted:agent"].calls]
    repair_prompt = prompts[-1].messages[-1].content
    assert "measured lever that gains 6 task(s) and loses none" in repair_prompt
    assert "MEASURED on the stored replies" in prompts[0].messages[-1].content


def transcript_added(ws, run_id: str) -> list[str]:  # noqa: ANN001
    return ws.store.get_record(run_id, "transcript", "r1")[-1].get("added", [])


def test_rules_about_harness_internals_or_in_third_person_are_refused() -> None:
    harness = seed_with("gsm8k")
    bad = {**RULE_SPEC, "changes": [{**RULE_SPEC["changes"][0], "text": "Modify the H2 parsing rule to accept "
                                      "'the answer is N' as valid answers"}]}
    with pytest.raises(SpecError, match="harness internals"):
        parse_spec(json.dumps(bad), harness, {"P1"})
    third = {**RULE_SPEC, "changes": [{**RULE_SPEC["changes"][0], "text": "The agent must end with Answer: N."}]}
    with pytest.raises(SpecError, match="address the agent directly"):
        parse_spec(json.dumps(third), harness, {"P1"})
    meta = {**RULE_SPEC, "changes": [{**RULE_SPEC["changes"][0], "text": "add rule about the tool's syntax"}]}
    with pytest.raises(SpecError, match="harness internals"):  # seen on DBBench: a rule about writing a rule
        parse_spec(json.dumps(meta), harness, {"P1"})
    lever_as_rule = {**RULE_SPEC, "changes": [{**RULE_SPEC["changes"][0], "text": "answer_phrase"}]}
    with pytest.raises(SpecError, match="names the built-in repair 'answer_phrase'"):
        parse_spec(json.dumps(lever_as_rule), harness, {"P1"})
    debate = {**RULE_SPEC, "skills": [{"id": "s", "trigger": "*", "tip": "I agree with the analyst: check sums."}]}
    with pytest.raises(SpecError, match="debate prose"):
        parse_spec(json.dumps(debate), harness, {"P1"})
    ok = {**RULE_SPEC, "changes": [{**RULE_SPEC["changes"][0], "text": "End your reply with a line Answer: N."}]}
    assert parse_spec(json.dumps(ok), harness, {"P1"}).changes[0].text.startswith("End your reply")


def learner(follows_demo: bool) -> ScriptedModel:
    """Wrong (but well-formed) answers, except for the task with a 0; right ones once a demo is shown."""

    def respond(messages: list[Message]) -> str:
        a, b = numbers(messages)
        demo_shown = sum(m.role == "assistant" for m in messages) > 0
        right = a == 0 or (follows_demo and demo_shown)
        return f"Answer: {a + b if right else a + b + 1}"

    return ScriptedModel(respond, name=f"learner-{follows_demo}")


@pytest.mark.parametrize("follows_demo", [True, False])
async def test_model_level_pattern_gets_a_demo_candidate_decided_by_acceptance(tmp_path, follows_demo) -> None:
    ws = make_ws(tmp_path, Roles(spec=DEMO_SPEC), learner(follows_demo), "train.rounds=1")
    result = await train_async(ws.config, "ecdysis", ws=ws)
    (p1, *_) = ws.store.get_record(result.run_id, "patterns", "r1")
    assert p1["facts"]["fixable_by"].startswith("model-level") and p1["facts"]["measured_levers"] == []
    assert any("demonstration the library bootstraps from passing training task q0" in x
               for x in p1["facts"]["needs_model_calls"])
    decision = ws.store.get_record(result.run_id, "decision", "r1")
    candidate = ws.store.load_version(decision["candidate"])
    assert "Answer: 3" in candidate.files["demos.json"]  # bootstrapped from the passing task q0 (0 + 3)
    assert decision["accepted"] is follows_demo
    assert (result.train_after > result.train_before) is follows_demo


def test_a_spec_with_one_bad_rule_keeps_its_valid_changes() -> None:
    from ecdysis.trainer.spec import salvage_spec

    harness = seed_with("gsm8k")
    spec = {"patterns_addressed": ["P1"], "changes": [
        {"layer": "H2", "kind": "enable_repair", "file": "", "text": "", "repair": "last_line", "value": 0,
         "rationale": "replies end in a bare answer"},
        {"layer": "H3", "kind": "add_rule", "file": "", "text": "add_rule / add_skill on the cause", "repair": "",
         "value": 0, "rationale": "copied"}], "skills": [], "implementation_notes": "", "expected_effect": ""}
    kept, dropped = salvage_spec(json.dumps(spec), harness, {"P1"})
    assert [c.repair for c in kept.changes] == ["last_line"] and "harness internals" in dropped[0]
    only_bad = {**spec, "changes": spec["changes"][1:]}
    assert salvage_spec(json.dumps(only_bad), harness, {"P1"}) is None


async def test_no_valid_spec_but_a_measured_lever_gives_a_library_spec(tmp_path) -> None:
    broken = {"patterns_addressed": ["enable_repair(answer_phrase)"], "changes": [], "skills": []}
    roles = Roles(spec=broken)
    ws = make_ws(tmp_path, roles, ScriptedModel(prose, name="prose"), "train.rounds=1", DEBATE_ALWAYS)
    result = await train_async(ws.config, "ecdysis", ws=ws)
    last = ws.store.get_record(result.run_id, "transcript", "r1")[-1]
    assert last["error"] and last["library_spec"] == ["enable_repair answer_phrase for P1"]
    assert ws.store.get_record(result.run_id, "decision", "r1")["accepted"] and result.train_after == 1.0


async def test_with_no_lever_left_and_no_usable_spec_the_library_tries_retrieved_examples(tmp_path) -> None:
    broken = {"patterns_addressed": ["P9"], "changes": [], "skills": []}
    ws = make_ws(tmp_path, Roles(spec=broken), learner(True), "train.rounds=1")
    result = await train_async(ws.config, "ecdysis", ws=ws)
    decision = ws.store.get_record(result.run_id, "decision", "r1")
    assert decision["library_candidate"] == "add_examples" and decision["accepted"]  # model-level: examples first
    examples = json.loads(ws.store.load_version(result.final_harness_id).files["examples.json"])
    assert examples["format"] == "Answer: {answer}" and len(examples["examples"]) == 6  # the training tasks
    assert {"prompt": "Add 0 and 3.", "answer": "3"} in examples["examples"]


def two_shapes(messages: list[Message]) -> str:
    a, b = numbers(messages)
    return f"The answer is {a + b} (from {a} and {b})." if a % 2 == 0 else f"Adding them gives\n{a + b}"


async def test_a_spec_naming_a_combination_in_text_but_enabling_one_repair_gets_the_combination(tmp_path) -> None:
    one = {"patterns_addressed": ["P1"], "changes": [
        {"layer": "H2", "kind": "enable_repair", "file": "", "text": "", "repair": "answer_phrase", "value": 0,
         "rationale": "P1: enable_repair answer_phrase+last_number"}], "skills": [],
        "implementation_notes": "enable_repair answer_phrase+last_number", "expected_effect": "all parse"}
    ws = make_ws(tmp_path, Roles(spec=one), ScriptedModel(two_shapes, name="two-shapes"), "train.rounds=1",
                 DEBATE_ALWAYS)
    result = await train_async(ws.config, "ecdysis", ws=ws)
    (p1, *_) = ws.store.get_record(result.run_id, "patterns", "r1")
    best = p1["facts"]["measured_levers"][0]
    assert len(best["repairs"]) >= 2 and best["gained"] == 6 and best["lost"] == 0
    decision = ws.store.get_record(result.run_id, "decision", "r1")
    assert decision["accepted"] and decision["variant"].startswith("measured lever")
    enabled = json.loads(ws.store.load_version(result.final_harness_id).files["repairs.json"])
    assert set(best["repairs"]) <= set(enabled) and result.train_after == 1.0
