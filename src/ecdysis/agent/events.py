"""Trajectory events as typed records: one pydantic model per kind, read through one discriminated union.

Events are written as JSON objects (`Trajectory.add` in the sandbox, the serve proxy, a free-form loop's
`session.note`) and stored that way, so every trajectory ever stored still loads; the host reads them as
these records (`Trajectory.typed_events`, `Trajectory.of`). A kind this version does not know, or a known
kind whose fields do not fit its record, is read as `UnknownEvent` with its fields kept: never dropped,
never a crash. Every field has a default, because older runs stored fewer of them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Tag, TypeAdapter, ValidationError, field_validator

from ..harness.api import ANSWER, RESPOND


class BaseEvent(BaseModel):
    """What every event has: its kind and the turn it happened in. Fields a writer added beyond the
    record's own are kept (`model_extra`)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    kind: str
    turn: int = 0


class PromptEvent(BaseEvent):
    """The system prompt an episode started with, the skills retrieved for it and the tools it offered."""

    kind: Literal["prompt"] = "prompt"
    system: str = ""
    skills: list[Any] = []
    tips: str = ""
    tools: list[dict[str, Any]] | None = None  # None: recorded before the offered tools were stored
    task: str = ""  # serve: the task prompt as the harness read it


class ModelEvent(BaseEvent):
    """One model call: the messages sent, the reply and its native tool calls."""

    kind: Literal["model"] = "model"
    messages: list[dict[str, Any]] = []
    reply: str = ""
    tool_calls: list[dict[str, Any]] = []
    finish_reason: str = ""
    usage: dict[str, Any] = {}
    latency_s: float = 0.0
    cache_hit: bool = False
    retries: int = 0
    unchosen: bool = False  # a self-consistency sample the vote did not choose

    @field_validator("tool_calls", mode="before")
    @classmethod
    def _no_calls(cls, value: Any) -> Any:
        return [] if value is None else value

    @field_validator("usage", mode="before")
    @classmethod
    def _no_usage(cls, value: Any) -> Any:
        return {} if value is None else value

    @property
    def truncated(self) -> bool:
        """The reply was cut off at the token limit."""
        return self.finish_reason == "length"


class ActionEvent(BaseEvent):
    """A realized action: a tool call, the final answer (`answer`) or a message to the user (`respond`)."""

    kind: Literal["action"] = "action"
    tool: str = ""
    input: str = ""
    arguments: Any = None

    @property
    def is_tool_call(self) -> bool:
        """The one definition of "a tool call": any action but the final answer and a message to the user."""
        return self.tool not in (ANSWER, RESPOND)


class ToolErrorEvent(BaseEvent):
    """A tool call that failed: schema validation (`unknown_tool`, `invalid_arguments`) or the tool's error."""

    kind: Literal["tool_error"] = "tool_error"
    tool: str = ""
    error: str = "tool_error"
    text: str = ""


class ObservationEvent(BaseEvent):
    """What the environment returned for an action."""

    kind: Literal["observation"] = "observation"
    text: str = ""

    @field_validator("text", mode="before")
    @classmethod
    def _as_text(cls, value: Any) -> str:
        return str(value)


class RepairEvent(BaseEvent):
    """A built-in H2 repair that changed what a reply realized to."""

    kind: Literal["repair"] = "repair"
    name: str = ""


class RejectionEvent(BaseEvent):
    """H2 rejected a reply; the feedback went back to the model."""

    kind: Literal["rejection"] = "rejection"
    feedback: str = ""
    rule: str = ""


class AnnotationEvent(BaseEvent):
    """An H4 annotation appended to an observation."""

    kind: Literal["annotation"] = "annotation"
    text: str = ""


class StopEvent(BaseEvent):
    """H4 stopped the episode."""

    kind: Literal["stop"] = "stop"
    reason: str = ""


class UserEvent(BaseEvent):
    """A simulated user's turn; `seen` is the digest of the conversation it answered (exact replay)."""

    kind: Literal["user"] = "user"
    text: str = ""
    stop: bool = False
    reason: str = ""
    seen: str = ""


class VoteEvent(BaseEvent):
    """A self-consistency vote over sampled answers."""

    kind: Literal["vote"] = "vote"
    answers: list[str | None] = []
    chosen: int = 0
    votes: int = 0


class UnknownEvent(BaseEvent):
    """An event of a kind this version does not read (e.g. a free-form loop's `session.note`), or of a known
    kind whose fields do not fit its record: all its fields are kept."""


KNOWN: dict[str, type[BaseEvent]] = {cls.model_fields["kind"].default: cls for cls in (
    PromptEvent, ModelEvent, ActionEvent, ToolErrorEvent, ObservationEvent, RepairEvent, RejectionEvent,
    AnnotationEvent, StopEvent, UserEvent, VoteEvent)}


def _tag(value: Any) -> str:
    kind = value.get("kind") if isinstance(value, dict) else getattr(value, "kind", None)
    return kind if kind in KNOWN else "unknown"


Event = Annotated[
    Annotated[PromptEvent, Tag("prompt")] | Annotated[ModelEvent, Tag("model")]
    | Annotated[ActionEvent, Tag("action")] | Annotated[ToolErrorEvent, Tag("tool_error")]
    | Annotated[ObservationEvent, Tag("observation")] | Annotated[RepairEvent, Tag("repair")]
    | Annotated[RejectionEvent, Tag("rejection")] | Annotated[AnnotationEvent, Tag("annotation")]
    | Annotated[StopEvent, Tag("stop")] | Annotated[UserEvent, Tag("user")] | Annotated[VoteEvent, Tag("vote")]
    | Annotated[UnknownEvent, Tag("unknown")],
    Discriminator(_tag),
]
_EVENT: TypeAdapter[Any] = TypeAdapter(Event)


def parse_event(data: dict[str, Any]) -> BaseEvent:
    """One stored event as its record; one that does not fit is an `UnknownEvent` with its fields."""
    try:
        return _EVENT.validate_python(data)
    except ValidationError:
        return UnknownEvent.model_validate({"kind": str(data.get("kind", "")), **{
            k: v for k, v in data.items() if k != "kind"}} | {"turn": _turn(data)})


def _turn(data: dict[str, Any]) -> int:
    try:
        return int(data.get("turn", 0))
    except (TypeError, ValueError):
        return 0
