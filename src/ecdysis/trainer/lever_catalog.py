"""The levers a harness spec can pull, one catalog entry each (as the H2 repairs are, `harness/repairs.py`).

A lever is declared once: its name (a spec change's `kind`), the layer it edits, the range of its `value`,
the line the roles read, whether its `text` is read by the agent, whether replay verifies it exactly, a
check of its own fields and how it is applied to a candidate's files. A spec's `Change` is defined here, its
`kind` checked against the catalog. Everything else reads the catalog: the spec's JSON schema and range checks
(`spec.py`), the internals filter of agent text, the roles' list of levers (`levers_text`), the deterministic
part of a spec, and candidate building (`implement.apply_structured`). Adding a lever is one `Lever` in `LEVERS`
(and its test).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator
from pydantic_core import PydanticKnownError

from ..agent.trajectory import Trajectory
from ..envs.base import Task
from ..harness.manifest import MANIFEST, HarnessVersion, set_manifest_value
from ..harness.repairs import CATALOG as REPAIRS
from ..harness.repairs import REPAIRS_FILE, enabled_names
from .demos import bootstrap_demo, examples_file, labelled_examples


def _lever_kind(value: Any) -> str:
    """A lever of the catalog as it is when the spec is parsed; otherwise the error a `Literal` of the
    catalog's kinds gives (models read it when asked to repair their spec)."""
    if isinstance(value, str) and value in LEVERS:
        return value
    names = [repr(k) for k in kinds()]
    expected = names[-1] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
    raise PydanticKnownError("literal_error", {"expected": expected})


ChangeKind = Annotated[str, BeforeValidator(_lever_kind)]
Layer = Literal["H2", "H3", "H4", "H5"]


class Change(BaseModel):
    """One edit of a spec: the lever `kind` pulled, with its fields (`spec.HarnessSpec.changes`)."""

    layer: Layer
    kind: ChangeKind
    file: str = ""  # edit_code: the file to rewrite
    text: str = ""  # add_rule: the rule; add_skill: the tip; edit_code: what to change
    repair: str = ""  # enable_repair: a name from the repair catalog, or a measured combination "a+b"
    value: int = 0  # a lever's number (set_max_tokens: tokens; add_examples: k; set_samples: n): the lever's ValueRange
    rationale: str = ""


@dataclass
class Draft:
    """A candidate's files while levers are applied to them, and what the levers read to write them."""

    current: HarnessVersion
    files: dict[str, str]
    trajectories: list[Trajectory]  # the current harness's training trajectories
    tasks: dict[str, Task]  # the training tasks by id

    def layer_file(self, layer: str, default: str) -> str:
        """The file the current harness keeps a layer in (the seed's name when it has none yet)."""
        return getattr(self.current.manifest.files, layer) or default


@dataclass(frozen=True)
class ValueRange:
    """The allowed `value` of a change. With a `default`, 0 means "the default"."""

    low: int
    high: int
    what: str = ""  # what the value counts, as errors name it
    default: int = 0

    def problem(self, value: int) -> str | None:
        if (self.default and value == 0) or self.low <= value <= self.high:
            return None
        what = f" ({self.what})" if self.what else ""
        return (f"value{what} must be between {self.low} and {self.high}"
                + (" (0: the default)" if self.default else ""))


Apply = Callable[[Draft, Change], str]
Check = Callable[[Change, HarnessVersion], "str | None"]


@dataclass(frozen=True)
class Lever:
    """One lever. `roles` is the line the roles read (`{low}`/`{high}` filled from `value`); `apply` writes
    the change into a draft and returns a note saying what it did (None: the implementer writes it, e.g. code);
    `exact`: replaying stored replies verifies its whole effect with no model call; `agent_text`: its `text`
    is read by the agent (checked by `spec.agent_text_problem`); `check`: what else its fields must satisfy
    (the reason, or None); `hint`: how pattern hints name it; `listing`: lines the roles read under it."""

    name: str
    layer: str
    roles: str
    apply: Apply | None
    value: ValueRange | None = None
    exact: bool = False
    agent_text: bool = False
    check: Check | None = None
    hint: str = ""
    listing: Callable[[], list[str]] | None = None

    def roles_line(self) -> str:
        line = self.roles.format(low=self.value.low, high=self.value.high) if self.value else self.roles
        return "\n".join([line, *(f"  - {item}" for item in self.listing())]) if self.listing else line

    def problems(self, change: Change, harness: HarnessVersion) -> list[str]:
        """What is wrong with a change of this kind, apart from agent text (see `spec.parse_spec`)."""
        out = [p] if self.value is not None and (p := self.value.problem(change.value)) else []
        return out + ([p] if self.check is not None and (p := self.check(change, harness)) else [])


DEFAULT_EXAMPLES = 3  # retrieved labelled examples per task, when a spec leaves `value` 0


def _enable_repair(d: Draft, change: Change) -> str:
    enabled = json.loads(d.files.get(REPAIRS_FILE) or "[]")
    names = [n for n in change.repair.split("+") if n]
    enabled += [n for n in names if n not in enabled]
    d.files[REPAIRS_FILE] = json.dumps(enabled) + "\n"
    return f"H2 repair(s) {'+'.join(names)} enabled"


def _repairs_listed() -> list[str]:
    return [f"{name}: {r.description}" for name, r in REPAIRS.items()]


def _known_repairs(change: Change, harness: HarnessVersion) -> str | None:
    """A repair (or combination) from the catalog that the harness does not have all of yet."""
    names = set(change.repair.split("+"))
    if not change.repair or not names <= set(REPAIRS):
        return f"repair must be one of {sorted(REPAIRS)} (or a measured combination a+b)"
    if names <= enabled_names(harness.files):
        return (f"the harness already has repair {change.repair!r} enabled, so enabling it changes nothing; "
                "pick a change the harness does not have yet")
    return None


def _add_rule(d: Draft, change: Change) -> str:
    contract, text = d.layer_file("contract", "contract.md"), change.text.strip()
    if text not in d.files.get(contract, ""):
        d.files[contract] = d.files.get(contract, "").rstrip() + "\n" + text + "\n"
    return f"H3 rule added to {contract}"


def _add_demo(d: Draft, change: Change) -> str:
    demo = bootstrap_demo(d.trajectories, d.tasks)
    if demo is None:
        return "add_demo skipped: no passing training trajectory to learn from"
    demos = d.layer_file("demos", "demos.json")
    existing = json.loads(d.files.get(demos) or "[]")
    if all(turn in existing for turn in demo):
        return "add_demo skipped: that demonstration is already in the harness"
    d.files[demos] = json.dumps(existing + demo, indent=1) + "\n"
    return f"H5 demo bootstrapped ({len(demo)} turn(s))"


def _add_examples(d: Draft, change: Change) -> str:
    k = change.value or DEFAULT_EXAMPLES
    text = examples_file(d.tasks, d.trajectories, k)
    if text is None:
        return "add_examples skipped: no training task has a plain gold answer"
    d.files[d.layer_file("examples", "examples.json")] = text
    return f"H5 retrieved labelled examples: {k} per task from {len(labelled_examples(d.tasks))} training tasks"


def _add_skill(d: Draft, change: Change) -> str:
    skills = d.layer_file("skills", "skills.json")
    items = json.loads(d.files.get(skills) or "[]")
    items.append({"id": f"s{len(items) + 1}", "trigger": "*", "tip": change.text.strip()})
    d.files[skills] = json.dumps(items, indent=1) + "\n"
    return "H5 skill added"


def _set_samples(d: Draft, change: Change) -> str:
    d.files[MANIFEST] = set_manifest_value(d.files[MANIFEST], "generation", "samples", change.value)
    return f"generation.samples = {change.value} (self-consistency; up to {change.value}x agent tokens)"


def _set_max_tokens(d: Draft, change: Change) -> str:
    d.files[MANIFEST] = set_manifest_value(d.files[MANIFEST], "generation", "max_tokens", change.value)
    return f"generation.max_tokens = {change.value}"


def _python_file(change: Change, harness: HarnessVersion) -> str | None:
    if change.file in harness.files and change.file.endswith(".py"):
        return None
    return f"file must be one of the harness's Python files {sorted(f for f in harness.files if f.endswith('.py'))}"


# in the order the roles read them
LEVERS: dict[str, Lever] = {lever.name: lever for lever in (
    Lever("enable_repair", "H2", "enable_repair (H2): turn on a built-in parser fallback by name (or a MEASURED "
          "combination by its id):", _enable_repair, exact=True, check=_known_repairs, listing=_repairs_listed),
    Lever("add_rule", "H3", "add_rule (H3): one sentence added to the system prompt (e.g. one that tells two "
          "confused answers apart)", _add_rule, agent_text=True),
    Lever("add_demo", "H5", "add_demo (H5): the library adds a worked example from a passing training task (tool "
          "calls included)", _add_demo),
    Lever("add_examples", "H5", "add_examples (H5, value = k): each task is shown the k most similar training tasks "
          "with their correct answers (for answers that parse but are wrong)", _add_examples,
          ValueRange(1, 8, "examples per task", default=DEFAULT_EXAMPLES),
          hint="add_examples: the k training tasks most similar to each task, with their gold answers, shown as "
               "worked examples (retrieved per task)"),
    Lever("add_skill", "H5", "add_skill (H5): a short tip retrieved for matching tasks", _add_skill, agent_text=True),
    Lever("set_samples", "generation", "set_samples (value = n, {low}-{high}): sample n answers and keep the "
          "majority (costs n x agent tokens)", _set_samples, ValueRange(3, 9, "samples per answer"),
          hint="set_samples: sample n answers and keep the majority (costs n x agent tokens)"),
    Lever("set_max_tokens", "generation", "set_max_tokens: change the reply length limit", _set_max_tokens,
          ValueRange(16, 4096), hint="a higher token limit"),
    Lever("edit_code", "H2/H4", "edit_code (H2/H4): rewrite action.py or regulate.py (risky; verified by replay)",
          None, check=_python_file),
)}

# the order of kinds in the spec's JSON schema: the kinds before the catalog existed keep their order (a
# response cache keys the moderator's calls on the schema), later levers follow in catalog order
_SCHEMA_ORDER = ("add_rule", "enable_repair", "add_skill", "add_demo", "add_examples", "set_samples",
                 "set_max_tokens", "edit_code")


def kinds() -> tuple[str, ...]:
    """Every lever's name, in the order the spec's schema lists them."""
    return (*(k for k in _SCHEMA_ORDER if k in LEVERS), *(k for k in LEVERS if k not in _SCHEMA_ORDER))


def levers_text() -> str:
    """The levers as the roles read them, one line each (the repairs `enable_repair` can turn on under it)."""
    return "\n".join(f"- {lever.roles_line()}" for lever in LEVERS.values())


def edits_only_h2(current: HarnessVersion, files: Mapping[str, str]) -> bool:
    """The files differ from `current` only in H2 parsing (the enabled repairs, the action file): replaying
    the stored replies verifies such a candidate with no model call."""
    edited = {f for f in set(files) | set(current.files) if files.get(f) != current.files.get(f)}
    return edited <= {REPAIRS_FILE, current.manifest.files.action}
