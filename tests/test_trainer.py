"""Trainer logic with scripted models: classification, spec repair, leak refusal, replay, acceptance, resume."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from helpers import BOXED_SPEC, Roles, add_answer, make_ws, seed_with, write_seed

from ecdysis.agent.trajectory import Trajectory
from ecdysis.envs.base import Task
from ecdysis.envs.jsonl_suite import JsonlSuite
from ecdysis.harness.repairs import CATALOG as REPAIRS
from ecdysis.harness.repairs import enabled_names
from ecdysis.models import Message, MeteredModel, ScriptedModel
from ecdysis.sandbox import SandboxLimits
from ecdysis.trainer import records, train_async
from ecdysis.trainer.accept import decide
from ecdysis.trainer.checks import CheckFailed, check_replay, check_static
from ecdysis.trainer.failures import aggregate, failure_record, suggest_levers
from ecdysis.trainer.fdcr import SpecWriter
from ecdysis.trainer.records import CandidateRecord, RoundRecord, SerialEdit, SpecRecord
from ecdysis.trainer.spec import spec_json_schema
from ecdysis.workspace import Workspace

ROLES = ("analyst", "critic", "engineer", "moderator", "implementer")
DEBATE = "train.engine.skip_debate_when_verified=false"  # the roles are asked even when a measured lever covers all


def traj(task_id: str, reply: str, termination: str = "rejected", trial: int = 0, passed: bool = False,
         rule: str = "answer-format") -> Trajectory:
    t = Trajectory(task_id=task_id, trial=trial, harness_id="h", termination=termination, passed=passed,
                   score=float(passed))
    t.add("model", 0, messages=[], reply=reply, finish_reason="stop")
    if termination == "rejected":
        t.add("rejection", 0, feedback="fmt", rule=rule)
    else:
        t.add("action", 0, tool="answer", input=reply.split()[-1])
        t.final_answer = reply.split()[-1]
    return t


def test_recurring_vs_isolated_classification() -> None:
    failures = [failure_record(traj(f"t{i}", f"so \\boxed{{{i}}}"), i) for i in range(4)]
    failures.append(failure_record(traj("t9", "I think it is 12", termination="answered"), 13))
    # t5 fails the boxed way in trial 0 but passes in trial 1: noise, not a harness defect
    failures.append(failure_record(traj("t5", "so \\boxed{5}"), 5))
    outcomes = {f"t{i}": (1, 0) for i in range(4)} | {"t9": (1, 0), "t5": (2, 1)}
    patterns = aggregate(failures, outcomes)
    boxed = next(p for p in patterns if "t0" in p.tasks)
    assert boxed.classification == "recurring" and len(boxed.tasks) == 5
    assert "4 distinct tasks" in boxed.reason and "only sometimes" in boxed.reason
    assert boxed.facts.expected_wrapper == {"boxed": 5} and boxed.layer == "H2"
    assert any("measured repairs" in lever for lever in boxed.levers)  # repairs are measured, not guessed
    lone = next(p for p in patterns if p.tasks == ["t9"])
    assert lone.classification == "isolated" and "one task" in lone.reason
    assert "reasoning error" in lone.levers[0] and not any("boxed" in lever for lever in lone.levers)
    flaky = aggregate([failure_record(traj("a", "\\boxed{1}"), 1), failure_record(traj("b", "\\boxed{2}"), 2)],
                      {"a": (2, 1), "b": (2, 0)})
    assert flaky[0].classification == "isolated" and "noise" in flaky[0].reason


def test_acceptance_rules() -> None:
    cur = {"a": [1.0, 1.0], "b": [0.0, 0.0], "c": [0.0, 0.0], "d": [0.0, 0.0]}
    better = {"a": [1.0, 1.0], "b": [1.0, 1.0], "c": [1.0, 1.0], "d": [1.0, 1.0]}
    same = dict(cur)
    slightly_worse = {"a": [1.0, 0.0], "b": [0.0, 0.0], "c": [0.0, 0.0], "d": [0.0, 0.0]}
    assert decide("strict", cur, better).accepted and not decide("strict", cur, same).accepted
    assert decide("tolerance", cur, slightly_worse, tolerance=0.2).accepted
    assert not decide("tolerance", cur, slightly_worse, tolerance=0.1).accepted
    assert decide("noise-aware", cur, better).accepted
    one_gain = {"a": [1.0, 1.0], "b": [1.0, 0.0], "c": [0.0, 0.0], "d": [0.0, 0.0]}
    assert not decide("noise-aware", cur, one_gain).accepted  # gain within noise
    trade = {"a": [0.0, 0.0], "b": [1.0, 1.0], "c": [1.0, 1.0], "d": [1.0, 1.0]}
    verdict = decide("noise-aware", cur, trade)
    assert not verdict.accepted and "reliably passing" in verdict.reason
    with pytest.raises(ValueError):
        decide("vibes", cur, better)


def _task(i: int) -> Task:
    return Task(id=f"task-{i}", split="train", prompt=f"What is {i} plus {i} when counting marbles in the jar?",
                gold=str(2 * i))


def test_leaking_edits_are_refused() -> None:
    current = seed_with("gsm8k")
    tasks = [_task(i) for i in range(60, 63)]
    contract = current.files["contract.md"]
    for leak, needle in ((f"{contract}\nFor task-61 say 122.", "task id"),
                         (f"{contract}\nRemember: what is 60 plus 60 when counting marbles in the jar",
                          "text of training"),
                         (f"{contract}\nIf unsure, answer 124.", "gold answer")):
        with pytest.raises(CheckFailed, match=needle):
            check_static(current, current.files | {"contract.md": leak}, tasks)
    fine = check_static(current, current.files | {"contract.md": contract + "\nNo LaTeX.\n"}, tasks)
    assert fine.id != current.id


def test_interface_and_path_checks() -> None:
    current = seed_with("gsm8k")
    with pytest.raises(CheckFailed, match="realize"):
        check_static(current, current.files | {"action.py": "def parse(reply):\n    return None\n"}, [])
    with pytest.raises(CheckFailed, match="inside the harness"):
        check_static(current, current.files | {"../evil.py": "x = 1\n"}, [])


async def test_replay_catches_an_extraction_change_that_breaks_a_passing_task(tmp_path: Path) -> None:
    suite = JsonlSuite(path=tmp_path / "none.jsonl")
    tasks = {t.id: t for t in [Task("p", "train", "q1", "7"), Task("f", "train", "q2", "9")]}
    stored = [traj("p", "work\nAnswer: 7", termination="answered", passed=True), traj("f", "so \\boxed{9}")]
    stored[0].final_answer = "7"
    limits = SandboxLimits(timeout_s=30)
    broken = seed_with("gsm8k", **{"action.py": (
        "import re\nfrom ecdysis.harness.api import Reject, answer\n"
        "def realize(reply, ctx):\n    m = re.search(r'boxed\\{(\\d+)\\}', reply)\n"
        "    return answer(m.group(1)) if m else Reject('use boxed', rule='boxed')\n")})
    with pytest.raises(CheckFailed, match="lose 1 passing task"):
        await check_replay(broken, stored, suite, tasks, limits)
    repaired = seed_with("gsm8k", **{"repairs.json": '["boxed_answer"]'})
    report = await check_replay(repaired, stored, suite, tasks, limits)
    assert report.gained == ["f"] and report.lost == []


async def test_invalid_spec_is_repaired_or_rejected(tmp_path: Path) -> None:
    from ecdysis.store import RunStore
    from ecdysis.trainer.failures import Pattern

    pattern = Pattern("P1", "boxed", ["s"], ["a", "b"], 2, "H2", "recurring", "r", {}, ["repair:boxed_answer"])
    bad = json.dumps(BOXED_SPEC | {"patterns_addressed": ["P7"]})
    store = RunStore(tmp_path / "run")
    for replies, ok in (([bad, json.dumps(BOXED_SPEC)], True), (["{not json", "[still not a spec"], False)):
        model = MeteredModel(ScriptedModel(replies), role="moderator")
        writer = SpecWriter(store, "run", dict.fromkeys(("analyst", "critic", "engineer", "moderator"), model))
        outcome = await writer.write(f"k{ok}", seed_with("gsm8k"), [pattern], passes=0)
        assert (outcome.spec is not None) is ok
        assert len(model.model.calls) == 2  # one spec, one repair with the error shown
        if ok:
            assert "unknown patterns ['P7']" in model.model.calls[1].messages[-1].content
        else:
            assert "spec rejected after repair" in outcome.error
    salvaged = MeteredModel(ScriptedModel(["{not json", bad]), role="moderator")
    writer = SpecWriter(store, "run", dict.fromkeys(("analyst", "critic", "engineer", "moderator"), salvaged))
    outcome = await writer.write("salvage", seed_with("gsm8k"), [pattern], passes=0)
    assert outcome.spec is not None and outcome.spec.patterns_addressed == ["P1"]  # the unknown id was dropped
    assert "unknown ['P7']" in outcome.transcript[-1]["dropped"][0]


WORDY_RULE = {"layer": "H3", "kind": "add_rule", "file": "", "text": "add_rule / add_skill on the cause", "repair": "",
              "value": 0, "rationale": "copied"}


WORDY_SKILL = {"id": "s1", "trigger": "answer", "tip": "The agent should let the parser find the number."}


@pytest.mark.parametrize("repair_wording, where", [(False, "rule"), (True, "rule"), (False, "skill")])
async def test_a_spec_refused_only_for_its_wording_is_kept_without_a_repair_call(tmp_path: Path, repair_wording: bool,
                                                                                 where: str) -> None:
    from ecdysis.config import RolesSection
    from ecdysis.store import RunStore
    from ecdysis.trainer.failures import Pattern

    pattern = Pattern("P1", "boxed", ["s"], ["a", "b"], 2, "H2", "recurring", "r", {}, ["repair:boxed_answer"])
    wordy = json.dumps(BOXED_SPEC | ({"changes": [*BOXED_SPEC["changes"], WORDY_RULE]} if where == "rule"
                                     else {"skills": [WORDY_SKILL]}))
    model = MeteredModel(ScriptedModel([wordy, json.dumps(BOXED_SPEC)]), role="moderator")
    writer = SpecWriter(RunStore(tmp_path / "run"), "run", dict.fromkeys(("analyst", "critic", "engineer", "moderator"),
                        model), RolesSection(repair_wording=repair_wording))
    outcome = await writer.write("k", seed_with("gsm8k"), [pattern], passes=0)
    assert outcome.spec is not None and [c.kind for c in outcome.spec.changes] == ["enable_repair"]
    assert outcome.spec.skills == []
    if repair_wording:  # asked again: the second reply is the spec
        assert len(model.model.calls) == 2 and "harness internals" in model.model.calls[1].messages[-1].content
        assert "dropped" not in outcome.transcript[-1]
    else:  # kept at once: the wordy rule dropped, one call
        assert len(model.model.calls) == 1 and "harness internals" in outcome.transcript[-1]["dropped"][0]


async def test_a_spec_refused_for_its_structure_still_gets_its_repair_call(tmp_path: Path) -> None:
    from ecdysis.store import RunStore
    from ecdysis.trainer.failures import Pattern
    from ecdysis.trainer.spec import SpecError, parse_spec

    pattern = Pattern("P1", "boxed", ["s"], ["a", "b"], 2, "H2", "recurring", "r", {}, ["repair:boxed_answer"])
    both = json.dumps(BOXED_SPEC | {"patterns_addressed": ["P7"], "changes": [*BOXED_SPEC["changes"], WORDY_RULE]})
    with pytest.raises(SpecError) as refused:
        parse_spec(both, seed_with("gsm8k"), {"P1"})
    assert not refused.value.wording_only and "harness internals" in str(refused.value)
    model = MeteredModel(ScriptedModel([both, "{not json"]), role="moderator")
    writer = SpecWriter(RunStore(tmp_path / "run"), "run", dict.fromkeys(("analyst", "critic", "engineer", "moderator"),
                        model))
    outcome = await writer.write("k", seed_with("gsm8k"), [pattern], passes=0)
    assert len(model.model.calls) == 2  # an unknown pattern is not wording: the repair call is made
    assert outcome.spec is None and outcome.error.startswith("spec rejected after repair")
    only_wordy = json.dumps(BOXED_SPEC | {"changes": [WORDY_RULE]})
    model = MeteredModel(ScriptedModel([only_wordy]), role="moderator")
    writer = SpecWriter(RunStore(tmp_path / "run2"), "run", dict.fromkeys(("analyst", "critic", "engineer",
                        "moderator"), model))
    outcome = await writer.write("k", seed_with("gsm8k"), [pattern], passes=0)
    assert len(model.model.calls) == 1 and outcome.spec is None  # nothing valid to keep, no library lever measured
    assert outcome.error.startswith("spec rejected (its wording; no repair asked)")


async def test_a_salvaged_spec_keeps_no_repair_whose_replay_gained_nothing(tmp_path: Path) -> None:
    """A writer that ignores the JSON grammar names a gainless repair beside a wordy rule: the wording refusal
    keeps the reply's valid changes, but not the repair `repairs_without_gain` would have sent back."""
    from ecdysis.store import RunStore
    from ecdysis.trainer.evidence import LeverEffect
    from ecdysis.trainer.failures import Pattern

    pattern = Pattern("P1", "boxed", ["s"], ["a", "b"], 2, "H2", "recurring", "r", {}, ["repair:boxed_answer"])
    pattern.measured = [LeverEffect(lever="enable_repair last_line", gained=2, lost=1)]  # not verified: no lever added
    rule = {"layer": "H3", "kind": "add_rule", "text": "End with the line 'Answer: <number>'.", "repair": "",
            "rationale": "r"}
    for n, changes in enumerate(([*BOXED_SPEC["changes"], rule, WORDY_RULE], [*BOXED_SPEC["changes"], WORDY_RULE])):
        model = MeteredModel(ScriptedModel([json.dumps(BOXED_SPEC | {"changes": changes})]), role="moderator")
        writer = SpecWriter(RunStore(tmp_path / f"run{n}"), "run", dict.fromkeys(("analyst", "critic", "engineer",
                                                                                  "moderator"), model))
        outcome = await writer.write("k", seed_with("gsm8k"), [pattern], passes=0)
        assert len(model.model.calls) == 1
        if n == 0:  # the rule is kept; the wordy rule and the gainless repair are dropped, each with its reason
            assert outcome.spec is not None and [c.kind for c in outcome.spec.changes] == ["add_rule"]
            dropped = outcome.transcript[-1]["dropped"]
            assert any("harness internals" in d for d in dropped)
            assert "enable_repair boxed_answer: replayed on the stored replies, it gains no task" in dropped[-1]
        else:  # nothing valid is left: no spec (no verified lever, so no library spec either)
            assert outcome.spec is None and outcome.error.startswith("spec rejected (its wording; no repair asked)")


async def test_a_repair_the_harness_already_has_cannot_be_the_spec(tmp_path: Path) -> None:
    """Seed 1 of the designed suite: 60 of `aggregate`'s rounds were spent on enable_repair of a repair the
    harness had. The writer's grammar no longer offers it, and a spec that names it anyway is sent back."""
    from ecdysis.store import RunStore
    from ecdysis.trainer.failures import Pattern

    pattern = Pattern("P1", "boxed", ["s"], ["a", "b"], 2, "H2", "recurring", "r", {}, ["repair:boxed_answer"])
    has_it = seed_with("gsm8k", **{"repairs.json": '["boxed_answer"]'})
    rule = BOXED_SPEC | {"changes": [{"layer": "H3", "kind": "add_rule", "text": "Put the answer in \\boxed{}.",
                                      "repair": "", "rationale": "r"}]}
    model = MeteredModel(ScriptedModel([json.dumps(BOXED_SPEC), json.dumps(rule)]), role="moderator")
    writer = SpecWriter(RunStore(tmp_path / "run"), "run", dict.fromkeys(("analyst", "critic", "engineer",
                                                                          "moderator"), model))
    outcome = await writer.write("k", has_it, [pattern], passes=0)
    offered = model.model.calls[0].params.json_schema["properties"]["changes"]["items"]["properties"]
    assert "boxed_answer" not in offered["repair"]["enum"] and "last_number" in offered["repair"]["enum"]
    assert "enable_repair" in offered["kind"]["enum"]
    assert "already has repair 'boxed_answer' enabled" in model.model.calls[1].messages[-1].content
    assert outcome.spec is not None and [c.kind for c in outcome.spec.changes] == ["add_rule"]
    everything = seed_with("gsm8k", **{"repairs.json": json.dumps(list(REPAIRS))})
    none_left = spec_json_schema(("boxed_answer+last_number",), enabled_names(everything.files))
    change = none_left["properties"]["changes"]["items"]["properties"]
    assert change["repair"]["enum"] == [""] and "enable_repair" not in change["kind"]["enum"]
    partly = spec_json_schema(("boxed_answer+last_number",), frozenset({"boxed_answer"}))
    assert "boxed_answer+last_number" in partly["properties"]["changes"]["items"]["properties"]["repair"]["enum"]


async def test_a_repair_known_to_rebuild_a_rejected_harness_is_not_offered(tmp_path: Path) -> None:
    """What the engine knows was validated and rejected (`tried`) is left out of the writer's grammar when it is
    a repair. Any other spec is not sent back for it (measured: the 1.5B writer returned the same spec 13 times
    of 13); the engine gives such a round to the library."""
    from ecdysis.store import RunStore
    from ecdysis.trainer.failures import Pattern

    pattern = Pattern("P1", "boxed", ["s"], ["a", "b"], 2, "H2", "recurring", "r", {}, ["repair:boxed_answer"])
    rule = BOXED_SPEC | {"changes": [{"layer": "H3", "kind": "add_rule", "text": "Put the answer in \\boxed{}.",
                                      "repair": "", "rationale": "r"}]}

    def tried(spec: Any) -> bool:
        return any(c.repair == "last_line" or c.kind == "add_rule" for c in spec.changes)

    model = MeteredModel(ScriptedModel([json.dumps(rule), json.dumps(BOXED_SPEC)]), role="moderator")
    writer = SpecWriter(RunStore(tmp_path / "run"), "run", dict.fromkeys(("analyst", "critic", "engineer",
                                                                          "moderator"), model))
    outcome = await writer.write("k", seed_with("gsm8k"), [pattern], passes=0, tried=tried)
    offered = model.model.calls[0].params.json_schema["properties"]["changes"]["items"]["properties"]["repair"]
    assert "last_line" not in offered["enum"] and "boxed_answer" in offered["enum"]
    assert len(model.model.calls) == 1 and outcome.spec is not None and outcome.spec.changes[0].kind == "add_rule"
    # measured patterns: only the repairs a measured lever holds are offered, and none when none gained
    from ecdysis.trainer.evidence import LeverEffect
    from ecdysis.trainer.fdcr import not_offered
    pattern.measured = [LeverEffect(lever="enable_repair boxed_answer+last_line", gained=2)]
    left_out = not_offered(("boxed_answer+last_line",), frozenset({"last_line"}), [pattern], lambda r: False)
    offered = spec_json_schema(("boxed_answer+last_line",), frozenset({"last_line"}), left_out)
    assert offered["properties"]["changes"]["items"]["properties"]["repair"]["enum"] == [
        "", "boxed_answer", "boxed_answer+last_line"]
    pattern.measured = []
    left_out = not_offered((), frozenset(), [pattern], lambda r: False)
    kinds = spec_json_schema((), frozenset(), left_out)["properties"]["changes"]["items"]["properties"]["kind"]
    assert left_out == frozenset(REPAIRS) and "enable_repair" not in kinds["enum"]


@pytest.mark.parametrize("skip", [False, True])
async def test_training_finds_the_format_failure_and_fixes_it(tmp_path: Path, skip: bool) -> None:
    roles = Roles()
    ws = make_ws(tmp_path, roles, ScriptedModel(add_answer, name="adder"),
                 f"train.engine.skip_debate_when_verified={str(skip).lower()}")
    result = await train_async(ws.config, "ecdysis", ws=ws)
    first = result.rounds[0]
    assert first.train_score == 0.0 and first.recurring == 1 and first.accepted
    assert result.rounds[1].stop == "nothing recurring left" and len(result.rounds) == 2
    assert result.test_before["accuracy"] == 0.0 and result.test_after["accuracy"] == 1.0
    assert json.loads((result.frozen_dir / "repairs.json").read_text()) == ["boxed_answer"]
    if skip:  # one measured zero-loss lever covers the one recurring pattern: no role is asked
        assert roles.calls == [] and result.optimizer_calls == 0
        assert records.load(ws.store, result.run_id, SpecRecord, "r1").source.startswith("library: enable_repair")
    else:
        assert roles.calls == ["ANALYST", "CRITIC", "ENGINEER"] * 2 + ["MODERATOR"]  # one spec per round
        assert result.optimizer_calls == 7
    # the seed's 6 training episodes ran; the repair leaves every prompt unchanged: its 6 are cache-served
    assert (result.agent_executions, result.cached_executions) == (6, 6)
    assert result.train_before == 0.0 and result.train_after == 1.0
    assert [(p.step, p.harness_id, p.train_score, p.accepted) for p in result.curve] == [
        (0, result.seed_harness_id, 0.0, False), (1, result.final_harness_id, 1.0, True)]
    candidate = ws.store.get_record(result.run_id, "candidate", "r1")
    assert candidate["replay"]["gained"] and not candidate["replay"]["lost"]


async def test_spec_written_again_after_a_kill_is_in_the_transcript_once(tmp_path: Path) -> None:
    """Killed after the writer's entry was checkpointed, before the spec record: found by the SIGKILL test."""
    from ecdysis.store import RunStore
    from ecdysis.trainer.failures import Pattern

    pattern = Pattern("P1", "boxed", ["s"], ["a", "b"], 2, "H2", "recurring", "r", {}, ["repair:boxed_answer"])
    store = RunStore(tmp_path / "run")
    roles = dict.fromkeys(("analyst", "critic", "engineer", "moderator"),
                          MeteredModel(ScriptedModel([json.dumps(BOXED_SPEC)] * 3), role="moderator"))
    for debate in (False, True):
        done = [{"pass": 0, "role": r, "text": "said"} for r in (("analyst", "critic", "engineer") if debate else ())]
        store.put_record("run", "transcript", f"k{debate}", [*done, {"pass": 1, "role": "writer", "text": "{}"}])
        outcome = await SpecWriter(store, "run", roles).write(f"k{debate}", seed_with("gsm8k"), [pattern],
                                                              passes=1 if debate else 0, debate=debate)
        assert outcome.spec is not None
        assert [t["role"] for t in outcome.transcript] == [t["role"] for t in done] + [
            "moderator" if debate else "analyst"]


async def test_killed_mid_debate_resumes_without_repeating_calls(tmp_path: Path) -> None:
    crashing = Roles(crash_after=4)
    ws = make_ws(tmp_path, crashing, ScriptedModel(add_answer, name="adder"), DEBATE)
    with pytest.raises(KeyboardInterrupt):
        await train_async(ws.config, "ecdysis", ws=ws)
    transcript = ws.store.get_record(ws.store.runs()[0]["id"], "transcript", "r1")
    assert [t["role"] for t in transcript] == ["analyst", "critic", "engineer", "analyst"]
    ws.close()
    resumed_roles = Roles()
    agent = ScriptedModel(add_answer, name="adder")
    ws2 = make_ws(tmp_path, resumed_roles, agent, DEBATE)
    result = await train_async(ws2.config, "ecdysis", ws=ws2)
    assert resumed_roles.calls == ["CRITIC", "ENGINEER", "MODERATOR"]  # finished turns not repeated
    assert result.rounds[0].accepted and result.test_after["accuracy"] == 1.0
    (tmp_path / "ref").mkdir()
    ref_ws = make_ws(tmp_path / "ref", Roles(), ScriptedModel(add_answer, name="adder"), DEBATE)
    reference = await train_async(ref_ws.config, "ecdysis", ws=ref_ws)
    assert [r.accepted for r in result.rounds] == [r.accepted for r in reference.rounds]
    assert result.final_harness_id == reference.final_harness_id
    # the collect evaluation finished before the kill and the repair leaves prompts unchanged, so the only
    # new agent calls are the 4 test tasks (the final harness's test run hits the cache)
    assert len(agent.calls) == 4


def test_skills_whose_trigger_matches_no_training_task_are_dropped() -> None:
    from ecdysis.trainer.implement import apply_structured
    from ecdysis.trainer.spec import HarnessSpec

    tasks = {t.id: t for t in (_task(1), _task(2))}
    spec = HarnessSpec.model_validate(BOXED_SPEC | {"skills": [
        {"id": "junk", "trigger": "P1", "tip": "The latest proposal overfits."},
        {"id": "count", "trigger": "marbles jar", "tip": "Count the marbles twice."}]})
    files, notes = apply_structured(seed_with("gsm8k"), spec, [], tasks)
    assert [s["id"] for s in json.loads(files["skills.json"])] == ["count"]
    assert any("junk dropped" in n for n in notes)


HURTFUL_RULE = {"layer": "H3", "kind": "add_rule", "file": "", "text": "Always add one to the result.",
                "repair": "", "value": 0, "rationale": "noise from the debate"}


def confused_by_the_rule(messages: list[Message]) -> str:
    if any("add one to the result" in m.content for m in messages):
        return "Adding them, plus one.\nThe result is \\boxed{999}"
    return add_answer(messages)


@pytest.mark.parametrize("arm", ["ecdysis", "serial"])
async def test_repairs_bundled_with_a_harmful_prompt_edit_are_validated_alone(tmp_path: Path, arm: str) -> None:
    spec = {**BOXED_SPEC, "changes": [*BOXED_SPEC["changes"], HURTFUL_RULE]}
    ws = make_ws(tmp_path, Roles(spec=spec), ScriptedModel(confused_by_the_rule, name="confusable"),
                 "train.rounds=1", "train.serial_max_edits=1", DEBATE)
    result = await train_async(ws.config, arm, ws=ws)
    assert result.test_after["accuracy"] == 1.0  # the whole spec scores 0 on train; the repair alone 1
    final = ws.store.load_version(result.final_harness_id)
    assert json.loads(final.files["repairs.json"]) == ["boxed_answer"]
    assert "add one to the result" not in final.files["contract.md"]
    decision = records.load(ws.store, result.run_id, RoundRecord, "r1")
    assert decision is not None and decision == result.rounds[0]
    variant = decision.variant if arm == "ecdysis" else decision.edits[0].variant
    assert variant == "repairs only" and decision.accepted


def test_wrong_but_parsed_answers_get_no_format_repair_suggested() -> None:
    """DBBench run: 6 wrong answers, 2 of them after a no-action rejection; a parsing repair cannot help."""
    records = [failure_record(traj(f"t{i}", "Final Answer: 7", termination="answered"), 9) for i in range(4)]
    records.append(failure_record(traj("t8", "Final Answer: 7", rule="no-action"), 9))
    levers = suggest_levers(records)
    assert not any("measured repairs" in lever for lever in levers)
    assert any("parsed but is wrong" in lever and "model-level" in lever for lever in levers)
    rejected = [failure_record(traj(f"r{i}", "Final Answer: 7", rule="no-action"), 7) for i in range(3)]
    assert any("measured repairs" in lever for lever in suggest_levers(rejected))


def test_round_records_are_typed_and_old_records_still_load(tmp_path: Path) -> None:
    from pydantic import ValidationError

    from ecdysis.store.db import RunStore

    store = RunStore(tmp_path)
    old = {"round": 1, "harness_before": "a", "harness_after": "a", "train_score": 0.5, "accepted": False,
           "patterns": 2, "recurring": 1, "edits": [{"task": "t1", "accepted": False, "attempted": False}]}
    store.put_record("run", "decision", "r1", old)  # as an earlier version wrote it: no stop, no candidate
    loaded = records.load(store, "run", RoundRecord, "r1")
    assert loaded is not None and loaded.stop is None and loaded.edits[0].task == "t1"
    assert loaded.attempts() == []  # the one edit was skipped (task already passed): nothing was spent
    store.put_record("run", "decision", "r2", old | {"train_score": "most"})
    with pytest.raises(ValidationError, match="train_score"):
        records.load(store, "run", RoundRecord, "r2")
    one = RoundRecord(round=3, harness_before="a", harness_after="b", train_score=1.0, candidate="b", accepted=True)
    serial = RoundRecord(round=4, harness_before="b", harness_after="b", train_score=1.0,
                         edits=[SerialEdit(task="x", accepted=True), SerialEdit(task="y", attempted=False)])
    assert [e.accepted for e in one.attempts()] == [True] and [e.task for e in serial.attempts()] == ["x"]
    records.put(store, "run", "r3", one)
    assert records.load(store, "run", RoundRecord, "r3") == one


async def test_a_verified_lever_rejected_on_val_goes_to_the_roles_next_round(tmp_path: Path) -> None:
    """Round 1 takes the measured lever without a debate; val rejects it; round 2 must not take the same
    lever again for free but ask the roles (what they write is then decided like any spec)."""
    rows = [{"id": f"q{i}", "prompt": f"Add {i} and {i + 3}.", "answer": str(2 * i + 3), "split": "train"}
            for i in range(6)]
    rows += [{"id": f"v{i}", "prompt": f"Add {100 + i} and {i}.", "answer": str(100 + 2 * i), "split": "val"}
             for i in range(4)]
    rows += [{"id": "t0", "prompt": "Add 1 and 1.", "answer": "2", "split": "test"}]

    def agent(messages: list[Message]) -> str:  # right on the training tasks, wrong on the val tasks
        a, b = map(int, re.findall(r"\d+", messages[-1].content)[:2])
        return f"The result is \\boxed{{{a + b + (1 if a >= 100 else 0)}}}"

    roles = Roles()
    ws = make_ws(tmp_path, roles, ScriptedModel(agent, name="agent"), 'train.accept_on="val"',
                 "train.acceptance=strict", rows=rows)  # sequential accepts the lever on its exact replays
    result = await train_async(ws.config, "ecdysis", ws=ws)
    first, second = result.rounds[0], result.rounds[1]
    assert not first.accepted and not second.accepted and "no strict gain" in first.reason
    assert records.load(ws.store, result.run_id, SpecRecord, "r1").source.startswith("library: enable_repair")
    assert records.load(ws.store, result.run_id, SpecRecord, "r2").source == "roles"
    assert roles.calls  # round 2 asked the roles
    assert result.stop_reason == "no edit accepted in 2 rounds in a row (train.engine.stop_after_rejections = 2)"


TOPICS = {"sports": ["The striker scored in the cup final", "The keeper saved a penalty in the final",
                     "The team won the league final", "The striker missed a penalty in the cup",
                     "The keeper scored in the league final"],
          "politics": ["Parliament passed the budget vote", "The senator won the election vote",
                       "The minister lost the budget vote", "The senator called an election vote",
                       "Parliament lost the election vote"]}
CAREFUL_RULE = {"patterns_addressed": ["P1"], "changes": [{
    "layer": "H3", "kind": "add_rule", "file": "", "text": "Read the question once more before you answer.",
    "repair": "", "value": 0, "rationale": "general"}], "skills": [], "implementation_notes": "", "expected_effect": ""}


def topic_ws(tmp_path: Path, roles: Roles) -> Workspace:
    """Topic labels (3 train + 2 val per label) and an agent that says "sports" unless shown an example (then it
    copies the nearest one's answer): the failures are model-level and retrieved examples fix them."""
    labels = list(TOPICS)
    rows = [{"id": f"{g[0]}{i}", "prompt": f"Which topic: {text}", "answer": g, "choices": labels,
             "split": "train" if i < 3 else "val"} for g in labels for i, text in enumerate(TOPICS[g])]
    rows += [{"id": "t0", "prompt": "Which topic: the budget vote", "answer": "politics", "choices": labels,
              "split": "test"}]

    def agent(messages: list[Message]) -> str:
        shown = [m.content for m in messages if m.role == "assistant"]
        return shown[-1] if shown else "Answer: sports"

    seed = write_seed(tmp_path / "labels-seed", "jsonl")
    return make_ws(tmp_path, roles, ScriptedModel(agent, name="agent"), 'train.accept_on="val"',
                   "train.val_limit=4", f'agent.harness="{seed}"', "train.acceptance=strict",  # 4 val tasks decide
                   rows=rows)


async def test_a_spec_that_rebuilds_a_rejected_harness_gives_the_round_to_the_library(tmp_path: Path) -> None:
    """The roles write the same rule every round; round 2 must not validate the harness round 1 rejected
    again but try the library's next lever (here retrieved labelled examples, which val accepts)."""
    roles = Roles(spec=CAREFUL_RULE)
    ws = topic_ws(tmp_path, roles)
    result = await train_async(ws.config, "ecdysis", ws=ws)
    first, second = result.rounds[0], result.rounds[1]
    assert not [p for p in roles.prompts if "you wrote was rejected" in p]  # no send-back: the library acts
    assert not first.accepted and "no strict gain" in first.reason
    assert records.load(ws.store, result.run_id, SpecRecord, "r2").source == "roles"  # the same spec again
    candidate = records.load(ws.store, result.run_id, CandidateRecord, "r2")
    assert candidate.source == "library: add_examples" and second.candidate != first.candidate
    assert second.library_candidate == "add_examples"
    assert second.accepted and "examples.json" in ws.store.load_version(second.harness_after).files


async def test_a_harness_already_rejected_is_never_validated_again(tmp_path: Path) -> None:
    """Serial's roles write the same rule for every failure: the first edit's harness is rejected on val;
    later edits build that same harness and are skipped as nothing new, without another val evaluation."""
    ws = topic_ws(tmp_path, Roles(spec=CAREFUL_RULE))
    result = await train_async(ws.config, "serial", ws=ws)
    edits = [e for r in result.rounds for e in r.edits]
    assert len(edits) >= 2 and not edits[0].accepted and "no strict gain" in edits[0].reason
    assert all(e.reason.startswith("nothing new to try") and not e.accepted for e in edits[1:]), edits
    with sqlite3.connect(ws.store.path) as db:
        validated = db.execute("select count(*) from evaluations where harness_id = ? and split = 'val'",
                               (edits[0].harness,)).fetchone()[0]
    assert validated == 1


async def test_an_h2_spec_whose_replay_changes_nothing_gives_the_round_to_the_library(tmp_path: Path) -> None:
    """The roles enable `boxed_answer` for replies that never hold a box: replay shows it changes no training
    episode, so the round validates the library's lever instead of a no-op."""
    ws = topic_ws(tmp_path, Roles())
    result = await train_async(ws.config, "ecdysis", ws=ws)
    first = result.rounds[0]
    candidate = records.load(ws.store, result.run_id, CandidateRecord, "r1")
    assert candidate.source == "library: add_examples" and first.accepted


async def test_the_debate_makes_no_role_call_once_the_budget_is_spent(tmp_path: Path) -> None:
    """As an evaluation starts no episode once the budget is spent, the roles start no call: the debate arm
    overshot its budget by a whole debate (DBBench seed 0: 1353 of 1200 charged s, the others <= 1217)."""
    from ecdysis.store import RunStore
    from ecdysis.trainer.failures import Pattern

    pattern = Pattern("P1", "boxed", ["s"], ["a", "b"], 2, "H2", "recurring", "r", {}, ["repair:boxed_answer"])
    store = RunStore(tmp_path / "run")
    for calls_allowed, where in ((2, "during the debate"), (3, "before the moderator's spec"),
                                 (4, "before the moderator's repair")):
        model = MeteredModel(ScriptedModel(["said"] * 3 + ["{not json", "{still not json"]), role="moderator")
        writer = SpecWriter(store, "run", dict.fromkeys(("analyst", "critic", "engineer", "moderator"), model),
                            spent=lambda n=calls_allowed, m=model: "budget spent: wall_s 1210/1200"
                            if len(m.model.calls) >= n else None)
        outcome = await writer.write(f"k{calls_allowed}", seed_with("gsm8k"), [pattern], passes=1)
        assert len(model.model.calls) == calls_allowed
        assert outcome.spec is None and outcome.error == f"no spec: budget spent: wall_s 1210/1200 {where}"


async def test_a_training_run_stops_mid_debate_when_its_budget_is_spent(tmp_path: Path) -> None:
    roles = Roles()
    ws = make_ws(tmp_path, roles, ScriptedModel(add_answer, name="adder"), DEBATE, "train.budget.optimizer_tokens=1")
    result = await train_async(ws.config, "ecdysis", ws=ws)
    assert roles.calls == ["ANALYST"]  # the critic, engineer and moderator were never asked
    first = result.rounds[0]
    assert not first.accepted and first.reason.startswith("no spec: budget spent: optimizer_tokens")
    assert result.stop_reason.startswith("budget spent: optimizer_tokens")
    assert result.final_harness_id == result.seed_harness_id
    assert [p.taken for p in result.curve if p.step > 0] == [False]  # the cut step is on the curve, not taken
    assert result.decisions() == (0, 0)  # a step cut by the budget is neither accepted nor rejected


async def test_a_resumed_writer_repeats_the_calls_it_paid_for_though_the_budget_is_now_spent(tmp_path: Path) -> None:
    """Killed after the spec call returned and before the spec was stored: the call's cost is already in the
    spend, so the resumed run sees the budget spent, yet the uninterrupted run kept that spec. A request the
    run already paid for is free: the resumed writer makes it again (a cache hit) and keeps the same spec."""
    from ecdysis.models import ResponseCache
    from ecdysis.store import RunStore
    from ecdysis.trainer.failures import Pattern

    pattern = Pattern("P1", "boxed", ["s"], ["a", "b"], 2, "H2", "recurring", "r", {}, ["repair:boxed_answer"])
    store = RunStore(tmp_path / "run")
    scripted = ScriptedModel([json.dumps(BOXED_SPEC)] * 2)

    def recorded(role: str, request: object, response: object) -> None:
        store.record_call("run", None, role, "m", 10, 10, 0.0, 0.0, False, call_key=response.request_key)  # type: ignore[attr-defined]

    model = MeteredModel(scripted, cache=ResponseCache(tmp_path / "c.sqlite"), role="analyst", listeners=[recorded])
    roles = dict.fromkeys(("analyst", "critic", "engineer", "moderator"), model)
    first = await SpecWriter(store, "run", roles).write("k", seed_with("gsm8k"), [pattern], passes=0, debate=False)
    assert first.spec is not None and len(scripted.calls) == 1

    def spent() -> str:
        return "budget spent: wall_s 1210/1200"

    resumed = await SpecWriter(store, "run", roles, spent=spent).write("k", seed_with("gsm8k"), [pattern], passes=0,
                                                                      debate=False)
    assert resumed.spec == first.spec and not resumed.stopped and len(scripted.calls) == 1  # served by the cache
    other = Pattern("P2", "other", ["s"], ["c", "d"], 2, "H2", "recurring", "r", {}, ["repair:boxed_answer"])
    unpaid = await SpecWriter(store, "run", roles, spent=spent).write("k2", seed_with("gsm8k"), [other], passes=0,
                                                                     debate=False)
    assert unpaid.spec is None and unpaid.stopped == spent() and len(scripted.calls) == 1


CODE_SPEC = {"patterns_addressed": ["P1"], "changes": [{"layer": "H2", "kind": "edit_code", "file": "action.py",
             "text": "read a boxed answer too", "repair": "", "value": 0,
             "rationale": "P1: the replies end in a boxed answer"}],
             "skills": [], "implementation_notes": "", "expected_effect": "format failures disappear"}


async def test_the_implementer_starts_no_sample_once_the_budget_is_spent(tmp_path: Path) -> None:
    """The spec is written while budget is left; its code change would need implementer samples, but the
    roles' call spent the budget: no sample is asked for, and the step is cut (not a rejection)."""
    class Writes(Roles):  # every role answers with the spec: the single analyst writes it in one call
        def __call__(self, messages: list[Message]) -> str:
            super().__call__(messages)
            return json.dumps(self.spec)

    roles = Writes(spec=CODE_SPEC)
    ws = make_ws(tmp_path, roles, ScriptedModel(add_answer, name="adder"), DEBATE, "train.budget.optimizer_tokens=1",
                 "train.debate_passes=0")
    result = await train_async(ws.config, ws=ws, arm="aggregate")
    assert len(roles.calls) == 1  # the spec's one call; the implementer was never asked
    first = result.rounds[0]
    assert first.reason.startswith("no candidate: budget spent: optimizer_tokens") and not first.decision_taken
    assert result.decisions() == (0, 0) and result.final_harness_id == result.seed_harness_id
    assert result.stop_reason.startswith("budget spent: optimizer_tokens")


BOXED_ACTION = ('import re\nfrom ecdysis.harness.api import Action, ActionContext, Reject, answer\n'
                'BOXED = re.compile(r"boxed\\{(-?\\d+)\\}")\n'
                'def realize(reply: str, ctx: ActionContext) -> Action | Reject:\n'
                '    found = BOXED.findall(reply)\n'
                '    if found:\n        return answer(found[-1])\n'
                '    return Reject("End with boxed", rule="answer-format")\n')


async def test_a_run_killed_inside_a_step_after_the_budget_ran_out_resumes_as_it_would_have_gone_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The spec call leaves budget, the implementer's sample spends it. Uninterrupted, the step goes on (an H2
    candidate is decided on exact replays, no new episode). Killed after the sample was paid, the resumed run
    must not stop at the round's start because the budget is now spent: it finishes the started step alike."""
    import ecdysis.trainer.implement as implement

    class Code(Roles):
        def __call__(self, messages: list[Message]) -> str:
            super().__call__(messages)
            wants_code = "must define realize" in messages[-1].content
            return json.dumps({"content": BOXED_ACTION}) if wants_code else json.dumps(self.spec)

    async def run(where: str, *overrides: str) -> Any:
        ws = make_ws(tmp_path / where, Code(spec=CODE_SPEC), ScriptedModel(add_answer, name="adder"), DEBATE,
                     "train.debate_passes=0", *overrides)
        return ws, await train_async(ws.config, ws=ws, arm="aggregate")

    (tmp_path / "probe").mkdir()
    ws, probe = await run("probe", "train.rounds=1")
    first_call = ws.store._rows("SELECT prompt_tokens + completion_tokens AS t FROM model_calls WHERE run_id=? AND "
                                "eval_id IS NULL ORDER BY id LIMIT 1", (probe.run_id,))[0]["t"]
    budget = f"train.budget.optimizer_tokens={first_call + 1}"  # left after the spec call, spent after a sample
    (tmp_path / "straight").mkdir()
    _, straight = await run("straight", budget)
    assert straight.rounds[0].accepted  # decided on replays after the budget ran out

    checked = implement.check_static

    def killed(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt("killed after the implementer's sample was paid")

    (tmp_path / "killed").mkdir()
    monkeypatch.setattr(implement, "check_static", killed)
    with pytest.raises(KeyboardInterrupt):
        await run("killed", budget)
    monkeypatch.setattr(implement, "check_static", checked)
    _, resumed = await run("killed", budget)
    assert [(r.accepted, r.reason) for r in resumed.rounds] == [(r.accepted, r.reason) for r in straight.rounds]
    assert resumed.final_harness_id == straight.final_harness_id


MEASURED = {"lever": "enable_repair answer_phrase", "repairs": ["answer_phrase"], "gained": 2, "lost": 0,
            "rescued_replies": 2, "changed_failing": 0, "changed_passing": 0, "model_calls": 0}
RULE_ONLY = {"patterns_addressed": ["P1"], "changes": [{"layer": "H3", "kind": "add_rule", "file": "",
             "text": "Put the final answer on its own line.", "repair": "", "value": 0, "rationale": "format"}],
             "skills": [], "implementation_notes": "", "expected_effect": ""}


@pytest.mark.parametrize("policy", ["LIBRARY", "PUBLISHED"])
async def test_the_writer_gives_the_librarys_levers_and_fallback_only_to_methods_whose_policy_takes_them(
        tmp_path: Path, policy: str) -> None:
    from ecdysis.store import RunStore
    from ecdysis.trainer import candidates
    from ecdysis.trainer.failures import Pattern

    library = getattr(candidates, policy)
    pattern = Pattern(id="P1", name="x", signatures=["s"], tasks=["a", "b"], support=2, layer="H2",
                      classification="recurring", reason="r", facts={"measured_levers": [MEASURED]}, levers=[])
    roles = ("analyst", "critic", "engineer", "moderator")
    # a spec that leaves the verified lever out without a word about P1's lever
    model = MeteredModel(ScriptedModel([json.dumps(RULE_ONLY), json.dumps(RULE_ONLY)]), role="analyst")
    writer = SpecWriter(RunStore(tmp_path / "a"), "run", dict.fromkeys(roles, model), policy=library)
    outcome = await writer.write("k", seed_with("gsm8k"), [pattern], passes=0, debate=False)
    assert outcome.spec is not None
    repairs = [c.repair for c in outcome.spec.changes if c.kind == "enable_repair"]
    if policy == "LIBRARY":  # sent back once, then the library adds the lever
        assert len(model.model.calls) == 2 and repairs == ["answer_phrase"]
    else:  # as published: the roles' spec as written, one call
        assert len(model.model.calls) == 1 and repairs == []
    # no usable spec at all: the library's measured spec stands in, or nothing does
    model = MeteredModel(ScriptedModel(["{not json", "{still not json"]), role="analyst")
    writer = SpecWriter(RunStore(tmp_path / "b"), "run", dict.fromkeys(roles, model), policy=library)
    outcome = await writer.write("k", seed_with("gsm8k"), [pattern], passes=0, debate=False)
    if policy == "LIBRARY":
        assert outcome.spec is not None and outcome.source.startswith("library")
    else:
        assert outcome.spec is None and outcome.error.startswith("spec rejected after repair")
