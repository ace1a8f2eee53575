"""The harness modification specification the Moderator writes: a pydantic model, its JSON schema
(flat, for grammar-constrained decoding by small models), and semantic validation.

A spec's `Change` pulls one lever of the catalog; both are defined in `lever_catalog`: the kinds, their value
ranges and their own checks come from there."""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from ..harness.manifest import HarnessVersion
from ..harness.repairs import CATALOG as REPAIRS
from .lever_catalog import LEVERS, Change, kinds


class SkillSpec(BaseModel):
    id: str
    trigger: str
    tip: str


class HarnessSpec(BaseModel):
    patterns_addressed: list[str] = Field(min_length=1)
    changes: list[Change] = Field(min_length=1, max_length=3)
    skills: list[SkillSpec] = Field(default_factory=list, max_length=2)
    implementation_notes: str = ""
    expected_effect: str = ""

    def summary(self) -> str:
        """One line naming each change, for prompts that show what earlier attempts tried: a repair by its name,
        any other change by its text (a stray `repair` on a rule is not what the rule added)."""
        return "; ".join(f"{c.kind} {c.repair if c.kind == 'enable_repair' else c.text[:80]}" for c in self.changes)

    def deterministic_part(self) -> HarnessSpec | None:
        """The changes replay verifies exactly (the catalog's `exact` levers: enabled H2 repairs) alone, when
        the spec bundles them with other edits; else None.

        That part leaves every prompt unchanged, so its validation is served by the response cache."""
        repairs = [c for c in self.changes if LEVERS[c.kind].exact]
        if not repairs or (len(repairs) == len(self.changes) and not self.skills):
            return None
        return self.model_copy(update={"changes": repairs, "skills": []})


class SpecError(ValueError):
    """Why a spec was refused. `wording_only`: every problem is the wording of a rule or tip the agent would read
    (`agent_text_problem`); the spec's structure is sound, so dropping those changes can leave a usable spec."""

    def __init__(self, message: str, wording_only: bool = False) -> None:
        super().__init__(message)
        self.wording_only = wording_only


def max_items(name: str) -> int:
    """A list field's max_length, read from HarnessSpec so the JSON schema and the model agree."""
    return next(m.max_length for m in HarnessSpec.model_fields[name].metadata if hasattr(m, "max_length"))


def repair_values(combinations: tuple[str, ...] = ()) -> list[str]:
    """What an enable_repair change may name: every catalog repair, then the measured combinations."""
    return [*REPAIRS, *(c for c in combinations if c not in REPAIRS)]


def repair_spec(repair: str, patterns: list[str]) -> HarnessSpec:
    """The spec that enables one repair (or combination) and nothing else."""
    return HarnessSpec.model_construct(patterns_addressed=patterns, skills=[], implementation_notes="",
                                       expected_effect="", changes=[Change(layer="H2", kind="enable_repair",
                                                                          repair=repair)])


def spec_json_schema(combinations: tuple[str, ...] = (), enabled: frozenset[str] = frozenset(),
                     left_out: frozenset[str] = frozenset()) -> dict[str, Any]:
    """A flat schema (no $ref) that llama.cpp's grammar converter and OpenAI both accept. `combinations`
    (measured levers' ids such as "answer_phrase+last_number") are allowed as `repair` values too.

    A repair (or combination) the harness already has all of (`enabled`), and the values in `left_out` (e.g.
    a repair whose enabling the run already rejected, or whose replay gained nothing), are left out of the
    `repair` values, and `enable_repair` out of the kinds when no repair is left: a grammar-constrained writer
    cannot spend its spec on a change that changes nothing or is known not to help.

    Strings are length-bounded: small models otherwise write until the token limit cuts the JSON.
    """
    s = {"type": "string", "maxLength": 200}
    short = {"type": "string", "maxLength": 40}
    repairs = [r for r in repair_values(combinations) if not set(r.split("+")) <= enabled and r not in left_out]
    change = {
        "type": "object",
        "properties": {
            "layer": {"type": "string", "enum": ["H2", "H3", "H4", "H5"]},
            "kind": {"type": "string", "enum": [k for k in kinds() if k != "enable_repair" or repairs]},
            "file": short, "text": s,
            "repair": {"type": "string", "enum": ["", *repairs]},
            "value": {"type": "integer"},
            "rationale": s,
        },
        "required": ["layer", "kind", "text", "repair", "rationale"],
    }
    skill = {"type": "object", "properties": {"id": short, "trigger": short, "tip": s},
             "required": ["id", "trigger", "tip"]}
    return {
        "type": "object",
        "properties": {
            "patterns_addressed": {"type": "array", "items": short, "minItems": 1, "maxItems": 4},
            "changes": {"type": "array", "items": change, "minItems": 1, "maxItems": max_items("changes")},
            "skills": {"type": "array", "items": skill, "maxItems": max_items("skills")},
            "implementation_notes": s,
            "expected_effect": s,
        },
        "required": ["patterns_addressed", "changes", "skills", "implementation_notes", "expected_effect"],
    }


@functools.lru_cache(maxsize=4)
def _internals(lever_names: tuple[str, ...]) -> re.Pattern[str]:
    """Words that give harness internals away: layers, parsing, files, pattern ids, every lever's name."""
    return re.compile(r"\b(H[1-5]|harness|layers?|levers?|repairs?|pars(?:e|er|ers|ing)|realiz\w*|regex\w*|"
                      r"action\.py|regulate\.py|contract\.md|P\d+|" + "|".join(map(re.escape, lever_names)) + "|"
                      r"train(?:ing)? evaluation|task\(s\)|"
                      r"add (?:an? |short )?(?:h[35] )?(?:rules?|tips?|skills?|demos?|demonstrations?))",
                      re.IGNORECASE)


_THIRD_PERSON = re.compile(r"\bthe (agent|model|assistant|llm)\b", re.IGNORECASE)
_DEBATE = re.compile(r"\b(analyst|critic|engineer|moderator|I agree|we should|the proposal|proposed change)\b",
                     re.IGNORECASE)


def agent_text_problem(text: str) -> str | None:
    """Why a rule or tip would not make sense to the agent, or None. It must be non-empty, addressed to
    the agent, about the task: no harness internals (layers, levers, repairs, parsing), no debate prose."""
    if not text.strip():
        return "is empty"
    named = next((name for name in REPAIRS if re.search(rf"\b{name}\b", text)), None)
    if named is not None:
        return (f"names the built-in repair {named!r}; a repair is enabled with enable_repair, a rule tells the "
                "agent what to do in the task")
    if (m := _internals(tuple(LEVERS)).search(text)) is not None:
        return (f"talks about harness internals ({m.group(0)!r}); the agent reads it: say what the agent "
                "should do in the task, not how the harness works")
    if (m := _DEBATE.search(text)) is not None:
        return f"copies debate prose ({m.group(0)!r}); write only the instruction itself"
    if (m := _THIRD_PERSON.search(text)) is not None:
        return f"speaks about {m.group(0)!r}; address the agent directly as 'you'"
    return None


REPLY_START = 80  # characters of an unusable reply quoted in its error


def not_json(text: str, exc: json.JSONDecodeError) -> str:
    """Why a role's reply is no spec at all: it is empty, or not JSON (where it broke, and how it starts)."""
    if not text.strip():
        return "the role's reply is empty, not a JSON spec"
    start = text.strip()[:REPLY_START].replace("\n", " ")
    more = "..." if len(text.strip()) > REPLY_START else ""
    return (f"the role's reply is not JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); "
            f"it starts: {start!r}{more}")


def schema_problems(exc: ValidationError, limit: int = 5) -> str:
    """A pydantic validation error as `where: what` parts (no URLs), at most `limit` of them."""
    parts = [f"{'.'.join(map(str, e['loc'])) or 'the spec'}: {e['msg']}" for e in exc.errors()]
    return "; ".join(parts[:limit]) + (f"; and {len(parts) - limit} more" if len(parts) > limit else "")


def parse_spec(text: str, harness: HarnessVersion, pattern_ids: set[str]) -> HarnessSpec:
    """Parse and check a spec against the harness and the patterns. Raises SpecError saying what is wrong."""
    try:
        spec = HarnessSpec.model_validate(json.loads(text))
    except json.JSONDecodeError as exc:
        raise SpecError(not_json(text, exc)) from exc
    except ValidationError as exc:
        raise SpecError(f"the spec does not match the schema: {schema_problems(exc)}") from exc
    problems: list[str] = []
    wording: list[str] = []  # problems of the agent-facing text alone
    unknown = [p for p in spec.patterns_addressed if p not in pattern_ids]
    if unknown:
        problems.append(f"patterns_addressed names unknown patterns {unknown}; known: {sorted(pattern_ids)}")
    for i, c in enumerate(spec.changes):
        where = f"changes[{i}] ({c.kind})"
        lever = LEVERS[c.kind]
        problems += [f"{where}: {problem}" for problem in lever.problems(c, harness)]
        if lever.agent_text and (why := agent_text_problem(c.text)):
            wording.append(f"{where}: the text {why}")
    for i, skill in enumerate(spec.skills):
        if why := agent_text_problem(skill.tip):
            wording.append(f"skills[{i}]: the tip {why}")
    if problems or wording:
        raise SpecError("; ".join(problems + wording), wording_only=not problems)
    return spec


def salvage_spec(text: str, harness: HarnessVersion, pattern_ids: set[str]) -> tuple[HarnessSpec, list[str]] | None:
    """The valid part of a spec whose only problems are individual changes or skills: those are dropped
    (with the reasons returned) if at least one valid change remains. None if nothing can be kept."""
    try:
        spec = HarnessSpec.model_validate(json.loads(text))
    except (json.JSONDecodeError, ValidationError):
        return None
    dropped: list[str] = []
    unknown = [p for p in spec.patterns_addressed if p not in pattern_ids]
    if unknown:
        known = [p for p in spec.patterns_addressed if p in pattern_ids] or sorted(pattern_ids)[:1]
        dropped.append(f"patterns_addressed: unknown {unknown}, kept {known}")
        spec = spec.model_copy(update={"patterns_addressed": known})
    keep: list[Change] = []
    for c in spec.changes:
        single = spec.model_copy(update={"changes": [c], "skills": []})
        try:
            parse_spec(single.model_dump_json(), harness, pattern_ids)
            keep.append(c)
        except SpecError as exc:
            dropped.append(f"{c.kind}: {exc}")
    skills = [k for k in spec.skills if not agent_text_problem(k.tip)]
    dropped += [f"skill {k.id}: {agent_text_problem(k.tip)}" for k in spec.skills if agent_text_problem(k.tip)]
    if not keep or not dropped:
        return None
    try:
        return parse_spec(spec.model_copy(update={"changes": keep, "skills": skills}).model_dump_json(),
                          harness, pattern_ids), dropped
    except SpecError:
        return None
