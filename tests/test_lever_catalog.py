"""The lever catalog: every spec kind is one entry, and spec parsing (kinds, value ranges, own checks), the
JSON schema, the roles' lever text, the agent-text filter, the deterministic part of a spec and candidate
building all read it, so a new entry is parseable, shown and applicable with nothing else changed."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from importlib import resources
from pathlib import Path
from typing import Literal

import pytest
from helpers import seed_with
from pydantic import BaseModel, ValidationError

from ecdysis.harness.manifest import MANIFEST, set_manifest_value
from ecdysis.harness.repairs import CATALOG as REPAIRS
from ecdysis.harness.repairs import REPAIRS_FILE
from ecdysis.trainer import failures, levers
from ecdysis.trainer.checks import check_static
from ecdysis.trainer.implement import apply_structured
from ecdysis.trainer.lever_catalog import LEVERS, Draft, Lever, ValueRange, edits_only_h2, kinds, levers_text
from ecdysis.trainer.spec import Change, HarnessSpec, SpecError, agent_text_problem, parse_spec, spec_json_schema

# what the roles read before the catalog existed, byte for byte: recorded runs' cached prompts depend on it
ROLES_TEXT_BEFORE = (
    "- enable_repair (H2): turn on a built-in parser fallback by name (or a MEASURED combination by its id):\n"
    + "\n".join(f"  - {name}: {r.description}" for name, r in REPAIRS.items()) + "\n"
    "- add_rule (H3): one sentence added to the system prompt (e.g. one that tells two confused answers apart)\n"
    "- add_demo (H5): the library adds a worked example from a passing training task (tool calls included)\n"
    "- add_examples (H5, value = k): each task is shown the k most similar training tasks with their correct "
    "answers (for answers that parse but are wrong)\n"
    "- add_skill (H5): a short tip retrieved for matching tasks\n"
    "- set_samples (value = n, 3-9): sample n answers and keep the majority (costs n x agent tokens)\n"
    "- set_max_tokens: change the reply length limit\n"
    "- edit_code (H2/H4): rewrite action.py or regulate.py (risky; verified by replay)"
)
SCHEMA_KINDS_BEFORE = ["add_rule", "enable_repair", "add_skill", "add_demo", "add_examples", "set_samples",
                       "set_max_tokens", "edit_code"]


def _spec(**change: object) -> str:
    return json.dumps({"patterns_addressed": ["P1"], "changes": [
        {"layer": "H2", "text": "", "repair": "", "rationale": "r", **change}]})


def _schema_kinds() -> list[str]:
    return spec_json_schema()["properties"]["changes"]["items"]["properties"]["kind"]["enum"]


def test_every_change_kind_is_one_catalog_entry_and_the_schema_lists_them_as_before() -> None:
    assert sorted(kinds()) == sorted(LEVERS) and len(set(kinds())) == len(LEVERS)
    assert _schema_kinds() == list(kinds()) == SCHEMA_KINDS_BEFORE
    for name, lever in LEVERS.items():
        assert lever.name == name and lever.roles.startswith(name)
        assert Change(layer="H2", kind=name).kind == name
    with pytest.raises(ValidationError):
        Change(layer="H2", kind="no_such_lever")


def test_an_unknown_kind_is_refused_with_the_message_a_literal_type_gave() -> None:
    class Before(BaseModel):  # how `kind` was declared before the catalog: the message models were shown
        kind: Literal[tuple(SCHEMA_KINDS_BEFORE)]  # type: ignore[valid-type]

    for bad in ("add_rules", 3, None):
        with pytest.raises(ValidationError) as before:
            Before(kind=bad)
        with pytest.raises(ValidationError) as now:
            Change(layer="H2", kind=bad)
        assert before.value.errors()[0]["msg"] == now.value.errors()[0]["msg"]
        assert str(before.value).split("\n", 1)[1] == str(now.value).split("\n", 1)[1]


@pytest.mark.parametrize("name", [n for n, lever in LEVERS.items() if lever.value is not None])
def test_value_ranges_in_parse_spec_come_from_the_catalog(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    harness = seed_with("gsm8k")
    r = LEVERS[name].value
    assert r is not None
    for good in (r.low, r.high, *((0,) if r.default else ())):
        assert parse_spec(_spec(kind=name, value=good), harness, {"P1"}).changes[0].value == good
    below = -1 if r.default and r.low == 1 else r.low - 1
    for bad in (below, r.high + 1):
        with pytest.raises(SpecError) as err:
            parse_spec(_spec(kind=name, value=bad), harness, {"P1"})
        assert f"changes[0] ({name}): {r.problem(bad)}" in str(err.value)
    wider = dataclasses.replace(LEVERS[name], value=ValueRange(r.low, r.high + 10, r.what, r.default))
    monkeypatch.setitem(LEVERS, name, wider)  # the check moves with the catalog's range
    assert parse_spec(_spec(kind=name, value=r.high + 1), harness, {"P1"}).changes[0].value == r.high + 1


def test_range_messages_read_as_before() -> None:
    assert LEVERS["add_examples"].value.problem(9) == ("value (examples per task) must be between 1 and 8 "
                                                        "(0: the default)")
    assert LEVERS["set_samples"].value.problem(2) == "value (samples per answer) must be between 3 and 9"
    assert LEVERS["set_max_tokens"].value.problem(8) == "value must be between 16 and 4096"


def test_the_roles_read_every_entry_and_the_text_is_unchanged() -> None:
    text = levers_text()
    heads = [line[2:] for line in text.splitlines() if line.startswith("- ")]
    assert [h.split(" ")[0].rstrip(":") for h in heads] == list(LEVERS)
    assert text == ROLES_TEXT_BEFORE


def test_agent_text_naming_any_lever_is_refused() -> None:
    for name in LEVERS:  # add_examples and set_samples were missing from the hand-written list
        assert "harness internals" in (agent_text_problem(f"Always use {name} when unsure.") or ""), name
    assert agent_text_problem("Check each step of your work once.") is None


def test_hints_and_prompts_name_only_catalog_levers_and_repairs() -> None:
    texts = [lever.hint for lever in LEVERS.values()]
    for module in (failures, levers):  # the hint texts are string constants of these modules
        tree = ast.parse(Path(str(module.__file__)).read_text())
        texts += [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    texts += [p.read_text() for p in resources.files("ecdysis.prompts").iterdir() if p.name.endswith(".md")]
    named = {m for t in texts for m in re.findall(r"\b(?:enable_repair|edit_code|add_[a-z]+|set_[a-z_]+)\b", t)}
    assert named and named <= set(LEVERS), named - set(LEVERS)
    repairs = {m for t in texts for m in re.findall(r"enable_repair ([a-z]+_[a-z_]+)", t)}
    assert repairs and repairs <= set(REPAIRS), repairs - set(REPAIRS)


def test_only_exact_levers_form_the_deterministic_part_and_h2_files_are_replayable() -> None:
    spec = HarnessSpec(patterns_addressed=["P1"], changes=[
        Change(layer="H2", kind="enable_repair", repair="boxed_answer"),
        Change(layer="H3", kind="add_rule", text="Give the final answer on its own line."),
        Change(layer="H2", kind="set_max_tokens", value=400)])
    part = spec.deterministic_part()
    assert part is not None and [c.kind for c in part.changes] == [n for n in LEVERS if LEVERS[n].exact]
    harness = seed_with("gsm8k")
    assert edits_only_h2(harness, {**harness.files, REPAIRS_FILE: '["boxed_answer"]\n'})
    assert not edits_only_h2(harness, {**harness.files, "contract.md": "Be brief.\n"})
    assert not edits_only_h2(harness, {k: v for k, v in harness.files.items() if k != "contract.md"})


def _set_max_turns(draft: Draft, change: Change) -> str:
    draft.files[MANIFEST] = set_manifest_value(draft.files[MANIFEST], "budget", "max_turns", change.value)
    return f"budget.max_turns = {change.value}"


def test_a_new_entry_is_parseable_shown_filtered_and_applied(monkeypatch: pytest.MonkeyPatch) -> None:
    lever = Lever("set_max_turns", "H4", "set_max_turns (value = n, {low}-{high}): allow n turns per episode",
                  _set_max_turns, ValueRange(1, 30, "turns per episode"))
    monkeypatch.setitem(LEVERS, lever.name, lever)
    harness = seed_with("gsm8k")
    spec = parse_spec(_spec(kind="set_max_turns", layer="H4", value=12), harness, {"P1"})
    with pytest.raises(SpecError, match=r"value \(turns per episode\) must be between 1 and 30"):
        parse_spec(_spec(kind="set_max_turns", layer="H4", value=31), harness, {"P1"})
    assert _schema_kinds() == [*SCHEMA_KINDS_BEFORE, "set_max_turns"]
    assert levers_text().splitlines()[-1] == "- set_max_turns (value = n, 1-30): allow n turns per episode"
    assert "set_max_turns" in (agent_text_problem("Raise set_max_turns first.") or "")
    files, notes = apply_structured(harness, spec, [], {})
    assert notes == ["budget.max_turns = 12"]
    assert check_static(harness, files, []).manifest.budget.max_turns == 12


def test_earlier_attempts_name_a_rule_by_its_text_not_a_stray_repair() -> None:
    """Designed seed 1: a rule written with `repair: "answer_set"` was listed as "add_rule answer_set", and the
    1.5B roles copied that line into later rules (refused: it names a built-in repair)."""
    spec = parse_spec(json.dumps({"patterns_addressed": ["P1"], "changes": [
        {"layer": "H3", "kind": "add_rule", "text": "Write the final answer alone.", "repair": "answer_set",
         "rationale": "r"},
        {"layer": "H2", "kind": "enable_repair", "text": "enable it", "repair": "last_line", "rationale": "r"}]}),
        seed_with("gsm8k"), {"P1"})
    assert spec.summary() == "add_rule Write the final answer alone.; enable_repair last_line"
