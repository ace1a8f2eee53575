"""The evidence the trainer reasons over, as typed records with their predicates on them.

`FailureFacts` are one failing episode's objective facts; `PatternFacts` aggregate them over a pattern;
`LeverEffect` is what replaying one lever did to a pattern's tasks; `Pattern` holds all three with the
levers attached to it. Each question is answered in one place: is a lever `safe`, `verified`,
does it act only on failing episodes (`acts_only_on_failing`), which tool-call failure an episode shows.

Patterns are stored as JSON (`Pattern.to_dict`, the shape runs have always stored: the measured levers
inside `facts`) and read back with `Pattern.from_dict`, records of older runs included. What the roles
read of a pattern's facts is `Pattern.prompt_facts`.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

# tool-call failure kinds, in priority order: an episode's failure kind is the first it shows
TOOL_FAILURES = ("unknown_tool", "invalid_arguments", "json_call_in_text", "tool_error", "repeated_call",
                 "no_tool_call")


class EvidenceRecord(BaseModel):
    model_config = ConfigDict(extra="ignore")


class FailureFacts(EvidenceRecord):
    """One failing episode, before any role speaks: how its reply ends, whether it was cut off or parsed,
    where the expected answer sits in it, and counts of tool-call failures."""

    shape: str
    truncated: bool = False
    answer_parsed: bool = False
    expected_in_reply: bool = False
    expected_wrapper: str | None = None  # boxed | answer_line | bold | plain; None: not in the reply
    tool_errors: int = 0
    turns: int = 0
    repairs_used: list[str] = Field(default_factory=list)
    crash: str | None = None
    crash_file: str | None = None
    tool_calls: int = 0
    unknown_tool: int = 0
    invalid_arguments: int = 0
    tool_error: int = 0
    repeated_call: int = 0
    json_call_in_text: int = 0
    no_tool_call: int = 0

    def tool_failures(self) -> dict[str, int]:
        """The tool-call failures the episode shows (kind -> count), in priority order."""
        return {kind: n for kind in TOOL_FAILURES if (n := getattr(self, kind))}

    def tool_failure(self) -> str | None:
        """The episode's tool-call failure kind: the first it shows, by priority."""
        return next(iter(self.tool_failures()), None)


class FailureExample(EvidenceRecord):
    """What the roles see of one failure of a pattern."""

    task_id: str
    last_reply: str = ""
    final_answer: str | None = None
    expected: str = ""
    detail: str = ""
    facts: FailureFacts


class Confusion(EvidenceRecord):
    expected: str
    given: str
    n: int


class LabelErrors(EvidenceRecord):
    errors: int
    tasks: int | None = None  # training tasks with that expected answer (None: not known)


class PatternFacts(EvidenceRecord):
    """A pattern's failures counted: how many tasks and failures, replies with the expected answer inside
    (and in which wrapper), cut off, parsed, rejected by which rule, tool-call failures by kind; for label
    answers the confusions (`confusions`, `label_errors`, absent otherwise)."""

    tasks: int = 0
    expected_in_reply: int = 0
    expected_wrapper: dict[str, int] = Field(default_factory=dict)
    truncated: int = 0
    answer_parsed: int = 0
    rules: dict[str, int] = Field(default_factory=dict)
    failures: int = 0
    tool_failures: dict[str, int] = Field(default_factory=dict)
    confusions: list[Confusion] | None = None
    label_errors: dict[str, LabelErrors] | None = None

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(exclude={k for k in ("confusions", "label_errors") if getattr(self, k) is None})


class LeverEffect(EvidenceRecord):
    """One measured lever (built-in repairs, replayed with zero model calls) on one pattern: `gained`,
    `rescued_replies` and `changed_failing` count the pattern's own tasks; `lost` and `changed_passing` count
    passing tasks of the whole evaluation (graded lost; acting differently with an outcome replay cannot
    know)."""

    lever: str
    repairs: list[str] = Field(default_factory=list)
    gained: int = 0
    lost: int = 0
    rescued_replies: int = 0
    changed_failing: int = 0
    changed_passing: int = 0
    model_calls: int = 0

    @model_validator(mode="before")
    @classmethod
    def _repairs_from_name(cls, data: Any) -> Any:
        if isinstance(data, dict) and not data.get("repairs") and isinstance(name := data.get("lever"), str):
            return {**data, "repairs": name.removeprefix("enable_repair ").split("+")}
        return data

    @property
    def safe(self) -> bool:
        """It loses no passing task and changes no passing episode."""
        return self.lost == 0 and self.changed_passing == 0

    @property
    def gains_losing_none(self) -> bool:
        """It gains tasks and loses none (a passing episode may act differently: validation decides)."""
        return self.gained > 0 and self.lost == 0

    @property
    def verified(self) -> bool:
        """It gains tasks, graded exactly, and is safe."""
        return self.gained > 0 and self.safe

    @property
    def acts_only_on_failing(self) -> bool:
        """It changes failing episodes (outcome known only from agent runs) and is safe."""
        return self.changed_failing > 0 and self.safe

    @property
    def acts(self) -> bool:
        """It does something on the pattern's tasks: gains, rescues rejected replies or changes episodes."""
        return bool(self.gained or self.rescued_replies or self.changed_failing)

    def order(self) -> tuple[int, ...]:
        """Sort key, best first: gains, then fewest passing tasks touched, then failing episodes changed,
        rescued replies, fewest repairs."""
        return (-self.gained, self.lost + self.changed_passing, -self.changed_failing, -self.rescued_replies,
                len(self.repairs))


class AnswerSetFact(EvidenceRecord):
    """The pattern's tasks declare an answer set of `labels` answers; replaying the `answer_set` repair lost
    (or changed) `lost` passing tasks."""

    labels: int
    lost: int

    @property
    def safe(self) -> bool:
        return self.lost == 0


def _facts_tag(value: Any) -> str:
    one = isinstance(value, FailureFacts) or (isinstance(value, dict) and "shape" in value)
    return "failure" if one else "pattern"


Facts = Annotated[Annotated[PatternFacts, Tag("pattern")] | Annotated[FailureFacts, Tag("failure")],
                  Discriminator(_facts_tag)]
_ATTACHED = ("measured_levers", "answer_set", "needs_model_calls", "fixable_by")  # stored inside `facts`


class Pattern(BaseModel):
    """A failure pattern: failures grouped across tasks, its facts and the levers attached to it.

    `facts` are a pattern's aggregated facts, or one episode's for the serial proposer's single-failure
    pattern. `measured` (None: nothing was measured), `answer_set`, `needs_model_calls` and `fixable_by`
    are set by `levers.attach`."""

    id: str
    name: str
    signatures: list[str]
    tasks: list[str]
    support: int  # failing trajectories
    layer: str
    classification: str  # recurring | isolated
    reason: str
    facts: Facts
    levers: list[str]
    evidence: list[FailureExample] = Field(default_factory=list)
    measured: list[LeverEffect] | None = None
    answer_set: AnswerSetFact | None = None
    needs_model_calls: list[str] = Field(default_factory=list)
    fixable_by: str | None = None

    def __init__(self, *args: Any, **data: Any) -> None:
        """Fields by name, or the first ones by position (id, name, signatures, tasks, ...) as before."""
        super().__init__(**dict(zip(type(self).model_fields, args, strict=False)), **data)

    @model_validator(mode="before")
    @classmethod
    def _attached_from_facts(cls, data: Any) -> Any:
        """A stored pattern keeps its attached levers inside `facts`: take them out."""
        if isinstance(data, dict) and isinstance(stored := data.get("facts"), dict) and set(_ATTACHED) & set(stored):
            facts = dict(stored)
            attached = {"measured" if k == "measured_levers" else k: facts.pop(k) for k in _ATTACHED if k in facts}
            return {**data, **attached, "facts": facts}
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Pattern:
        return cls.model_validate(data)

    def to_dict(self) -> dict[str, Any]:
        """The stored shape: the attached levers inside `facts`."""
        return {"id": self.id, "name": self.name, "signatures": list(self.signatures), "tasks": list(self.tasks),
                "support": self.support, "layer": self.layer, "classification": self.classification,
                "reason": self.reason, "facts": self.stored_facts(), "levers": list(self.levers),
                "evidence": [e.model_dump() for e in self.evidence]}

    def stored_facts(self) -> dict[str, Any]:
        """The facts with the attached levers, as stored."""
        facts = self.facts.to_dict() if isinstance(self.facts, PatternFacts) else self.facts.model_dump()
        if self.measured is not None:
            facts |= {"measured_levers": [m.model_dump() for m in self.measured],
                      **({"answer_set": self.answer_set.model_dump()} if self.answer_set is not None else {}),
                      "needs_model_calls": list(self.needs_model_calls)}
        return facts | ({"fixable_by": self.fixable_by} if self.fixable_by is not None else {})

    def prompt_facts(self) -> dict[str, Any]:
        """The facts the roles read as JSON: the observed facts (without the confusions, shown on their own
        line) and the declared answer set."""
        shown = self.facts.model_dump(exclude={"confusions", "label_errors"})
        return shown | ({"answer_set": self.answer_set.model_dump()} if self.answer_set is not None else {})

    @property
    def recurring(self) -> bool:
        return self.classification == "recurring"

    @property
    def tool_failures(self) -> dict[str, int]:
        """Tool-call failures counted over the pattern. An aggregated pattern's only: the serial proposer's
        single-failure pattern never reported them (its recorded prompts are kept as they were)."""
        return self.facts.tool_failures if isinstance(self.facts, PatternFacts) else {}

    @property
    def rules(self) -> dict[str, int]:
        """H2 rules that rejected the pattern's replies (aggregated patterns; see `tool_failures`)."""
        return self.facts.rules if isinstance(self.facts, PatternFacts) else {}

    @property
    def confusions(self) -> list[Confusion]:
        return (self.facts.confusions or []) if isinstance(self.facts, PatternFacts) else []

    @property
    def label_errors(self) -> dict[str, LabelErrors]:
        return (self.facts.label_errors or {}) if isinstance(self.facts, PatternFacts) else {}

    def verified_lever(self) -> LeverEffect | None:
        """The best measured lever that is `verified` (gains tasks graded exactly, loses none), if any."""
        return next((m for m in self.measured or [] if m.verified), None)

    def candidate_lever(self) -> LeverEffect | None:
        """The best measured lever that is verified, else one that acts only on failing episodes."""
        return self.verified_lever() or next((m for m in self.measured or [] if m.acts_only_on_failing), None)
