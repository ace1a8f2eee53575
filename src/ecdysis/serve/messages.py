"""The messages between `serve` and the sandboxed child that runs one request's harness code (pydantic).

One child per request, one exchange per child, JSON lines framed by `sandbox.framing` (bounded size,
validated against these models; anything else is a `ProtocolError`):

    child -> host   Ready (the harness code loaded; the isolation it runs under) or LoadFailed
    host  -> child  RealizeRequest | RegulateRequest, with a fresh random `id`
    child -> host   Realized | Verdicts | Failed, carrying that `id`

The host reads exactly one start message and one reply per child and then kills it, so a line the harness
code writes on the channel itself is either the reply (it decides its own layer's result anyway) or a
protocol violation that fails that request only. Unknown fields are violations too.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from ..harness.api import Action, StepState, Verdict


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ActionRecord(_Message):
    """A realized action (`harness.api.Action`) on the wire."""

    tool: str
    input: str = ""
    arguments: dict[str, Any] | None = None
    call_id: str = ""

    @classmethod
    def of(cls, action: Action) -> ActionRecord:
        return cls(tool=action.tool, input=action.input, arguments=action.arguments, call_id=action.call_id)

    def action(self) -> Action:
        return Action(self.tool, self.input, self.arguments, self.call_id)


class CallRecord(_Message):
    """One native tool call of the upstream reply."""

    id: str = ""
    name: str = ""
    arguments: str = "{}"


class StateRecord(_Message):
    """What H4 sees after a tool result (`harness.api.StepState`)."""

    turn: int
    max_turns: int
    action: ActionRecord
    observation: str
    history: list[tuple[ActionRecord, str]]

    @classmethod
    def of(cls, s: StepState) -> StateRecord:
        return cls(turn=s.turn, max_turns=s.max_turns, action=ActionRecord.of(s.action), observation=s.observation,
                   history=[(ActionRecord.of(a), o) for a, o in s.history])

    def state(self) -> StepState:
        return StepState(self.turn, self.max_turns, self.action.action(), self.observation,
                         [(a.action(), o) for a, o in self.history])


class RealizeRequest(_Message):
    """H2 on one upstream reply, against the request's tools (`ToolSpec` records)."""

    op: Literal["realize"] = "realize"
    id: str
    text: str
    calls: list[CallRecord]
    turn: int
    task: str
    tools: list[dict[str, Any]]


class RegulateRequest(_Message):
    """H4 on tool results not regulated before."""

    op: Literal["regulate"] = "regulate"
    id: str
    states: list[StateRecord]


LayerRequest = TypeAdapter(Annotated[RealizeRequest | RegulateRequest, Field(discriminator="op")])


class Ready(_Message):
    """The child loaded the harness code and waits for its request."""

    op: Literal["ready"] = "ready"
    isolation: str


class LoadFailed(_Message):
    op: Literal["load_failed"] = "load_failed"
    error: str


StartMessage = TypeAdapter(Annotated[Ready | LoadFailed, Field(discriminator="op")])


class Realized(_Message):
    """H2's result before validation (the host validates the actions against the request's tools)."""

    op: Literal["realized"] = "realized"
    id: str
    text: str  # the reply text after message-stage repairs
    actions: list[ActionRecord] = []
    repairs: list[str] = []
    reject_rule: str = ""
    feedback: str = ""


class VerdictRecord(_Message):
    annotation: str = ""
    stop: bool = False
    reason: str = ""

    def verdict(self) -> Verdict:
        return Verdict(self.annotation, self.stop, self.reason)


class Verdicts(_Message):
    """H4's verdict on each state of the request, in order."""

    op: Literal["verdicts"] = "verdicts"
    id: str
    verdicts: list[VerdictRecord]


class Failed(_Message):
    """The harness code raised (or returned the wrong type) on this request."""

    op: Literal["failed"] = "failed"
    id: str
    error: str


LayerReply = TypeAdapter(Annotated[Realized | Verdicts | Failed, Field(discriminator="op")])
