"""The wire protocol between the host and an episode worker: every message, typed.

One JSON object per line, read on the host only through `framing.read_message` (bounded line size, schema
validation, `ProtocolError`). The exchange of one episode:

    host -> worker   EpisodeRequest                 (or ReplayRequest: re-realize stored replies, no model)
    worker -> host   Started                        (in-process measures taken, before any harness code)
    worker -> host   ChatCall(id) / UserCall(id)    a model turn / the simulated user's turn
    host -> worker   ChatReply(id) / UserReply(id)  its answer, matched to the call by id
    worker -> host   DoneReport                     what the agent did (or ReplayResult)
    parent -> host   ExitNote                       a forked worker's exit status, from its parent

Everything the worker sends is written by a process that runs harness code, so it says only what the agent
did: events, final answer and state, conversation and how the agent's side ended. The host builds every
field it records (task, trial, termination, score, isolation, timings, call and token counts) itself.
Replies carry nothing about the host's cache (no hit flag, no latency, no token counts).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

# How the agent's side of an episode can end, as the worker reports it. The host alone gives the other
# terminations (`timeout`, `budget`, `infra_error`) and turns any protocol violation into `crash`.
AGENT_ENDINGS = ("answered", "max_turns", "rejected", "stopped", "done", "user_stop", "crash", "model_error")
Ending = Literal["answered", "max_turns", "rejected", "stopped", "done", "user_stop", "crash", "model_error"]
Measure = Literal["netns", "rlimits", "audit-hook"]  # in-process measures a worker applies to itself
CALL_KINDS = ("model", "user")  # event kinds that cite a call the host served (`call`: its id)


# Schemas are built on first use (`defer_build`): a fresh worker process pays only for the messages it uses.
_DEFERRED = ConfigDict(defer_build=True)


class _Message(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, defer_build=True)


class WorkerLimits(BaseModel):
    """The resource limits the worker applies to itself (rlimits) before harness code runs."""

    model_config = _DEFERRED

    memory_mb: int
    cpu_s: int
    file_mb: int
    max_tasks: int | None = None


# --- host -> worker ---------------------------------------------------------------------------------------

class EpisodeRequest(_Message):
    op: Literal["episode"] = "episode"
    files: dict[str, str]
    harness_id: str
    env: str
    env_options: dict[str, Any] = Field(default_factory=dict)
    task: dict[str, Any]  # the task's public view: id, prompt, public fields, conversational
    trial: int
    limits: WorkerLimits
    has_user: bool = False
    plugin_paths: list[str] = Field(default_factory=list)
    confined: str = ""  # OS measures the host started the worker under


class ReplayRequest(_Message):
    op: Literal["replay"] = "replay"
    files: dict[str, str]
    items: list[dict[str, Any]]
    limits: WorkerLimits
    confined: str = ""


class ChatReply(_Message):
    """The model's reply to call `id` (or why there is none)."""

    op: Literal["chat_reply"] = "chat_reply"
    id: int
    text: str = ""
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)
    finish_reason: str = ""
    error: str | None = None


class UserReply(_Message):
    """The simulated user's next message for call `id`; `stop` ends the conversation (`limit`: its turn limit)."""

    op: Literal["user_reply"] = "user_reply"
    id: int
    text: str = ""
    stop: bool = False
    limit: bool = False
    reason: str = ""
    error: str | None = None


# --- worker -> host ---------------------------------------------------------------------------------------

class Started(_Message):
    """Sent once, after the worker's in-process measures and before harness code is loaded."""

    op: Literal["started"] = "started"
    measures: list[Measure] = Field(default_factory=list)


class ChatCall(_Message):
    op: Literal["chat"] = "chat"
    id: int = Field(ge=0)
    messages: list[dict[str, Any]]
    params: dict[str, Any] = Field(default_factory=dict)


class Turn(_Message):
    """One text turn of a conversation as the simulated user sees it."""

    role: Literal["user", "assistant"]
    content: str


class UserCall(_Message):
    op: Literal["user"] = "user"
    id: int = Field(ge=0)
    conversation: list[Turn]


class _Payload(BaseModel):
    model_config = ConfigDict(extra="allow", defer_build=True)


class _ActionEvent(_Payload):
    tool: str
    input: str = ""
    arguments: dict[str, Any] | None = None


class _TextEvent(_Payload):
    text: str


class _ToolErrorEvent(_Payload):
    tool: str
    error: str
    text: str


class _RejectionEvent(_Payload):
    feedback: str
    rule: str


class _RepairEvent(_Payload):
    name: str


class _StopEvent(_Payload):
    reason: str = ""


class _VoteEvent(_Payload):
    answers: list[str | None]
    chosen: int
    votes: int


class _PromptEvent(_Payload):
    system: str
    skills: list[str] = Field(default_factory=list)
    tips: str = ""
    tools: list[dict[str, Any] | str] = Field(default_factory=list)


# The fields the host and the trainer read from the agent loop's own event kinds; a free-form loop's notes
# of other kinds are kept as they are.
EVENT_FIELDS: dict[str, type[_Payload]] = {
    "action": _ActionEvent, "observation": _TextEvent, "annotation": _TextEvent, "tool_error": _ToolErrorEvent,
    "rejection": _RejectionEvent, "repair": _RepairEvent, "stop": _StopEvent, "vote": _VoteEvent,
    "prompt": _PromptEvent,
}


class Event(BaseModel):
    """One event of the agent's record; `call` is the id of the call a `model` or `user` event stands for
    (the host fills in that call's messages, reply and accounting from what it served). The loop's own kinds
    must carry their fields (`EVENT_FIELDS`): the trainer reads them."""

    model_config = ConfigDict(extra="allow", defer_build=True)
    kind: str = Field(min_length=1, max_length=64)
    turn: int = Field(ge=0)
    call: int | None = None

    @model_validator(mode="after")
    def _fits_its_kind(self) -> Event:
        if self.kind in CALL_KINDS and self.call is None:
            raise ValueError(f"a {self.kind!r} event must name the call it stands for (`call`)")
        if self.kind in EVENT_FIELDS:
            EVENT_FIELDS[self.kind].model_validate(self.model_extra or {})
        return self


class EpisodeReport(_Message):
    """What the agent did. Fields the host owns (task, trial, score, termination, isolation, counts) are
    not part of it: sent anyway, they are ignored."""

    ending: Ending
    events: list[Event] = Field(default_factory=list)
    final_answer: str | None = None
    final_state: dict[str, Any] = Field(default_factory=dict)
    conversation: list[dict[str, Any]] = Field(default_factory=list)
    traceback: str | None = None


class DoneReport(_Message):
    op: Literal["done"] = "done"
    report: EpisodeReport


class ReplayAction(_Message):
    tool: str
    input: str
    arguments: dict[str, Any] | None = None
    invalid: str | None = None


class RealizedReply(_Message):
    """One stored reply re-realized by the candidate's H2: rejected (`reject`: the rule) or its actions."""

    reject: str | None = None
    actions: list[ReplayAction] | None = None
    repairs: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_outcome(self) -> RealizedReply:
        if (self.reject is None) == (self.actions is None):
            raise ValueError("a realized reply has either `reject` or `actions`")
        return self

    def record(self) -> dict[str, Any]:
        """The shape the trainer's checks read: {"reject": rule} or {"actions": [...], "repairs": [...]}."""
        if self.reject is not None:
            return {"reject": self.reject}
        return {"actions": [a.model_dump() for a in self.actions or []], "repairs": list(self.repairs)}


class ReplayResult(_Message):
    op: Literal["replay_result"] = "replay_result"
    results: list[list[RealizedReply]] | None = None
    error: str | None = None


class ExitNote(_Message):
    """A forked worker's exit status, written on its channel by its parent in the zygote."""

    op: Literal["exit"] = "exit"
    status: int


HOST_REQUEST: TypeAdapter[EpisodeRequest | ReplayRequest] = TypeAdapter(
    Annotated[EpisodeRequest | ReplayRequest, Field(discriminator="op")], config=_DEFERRED)
EPISODE_MESSAGE: TypeAdapter[Started | ChatCall | UserCall | DoneReport | ExitNote] = TypeAdapter(
    Annotated[Started | ChatCall | UserCall | DoneReport | ExitNote, Field(discriminator="op")], config=_DEFERRED)


def build_schemas() -> None:
    """Build every message's schema now (they are built on first use otherwise): the zygote does it once, so
    the episodes it forks do not each build them."""
    for model in (WorkerLimits, EpisodeRequest, ReplayRequest, ChatReply, UserReply, Started, ChatCall, Turn,
                  UserCall, Event, EpisodeReport, DoneReport, ReplayAction, RealizedReply, ReplayResult, ExitNote,
                  *EVENT_FIELDS.values()):
        model.model_rebuild(force=True)
    HOST_REQUEST.rebuild(force=True)
    EPISODE_MESSAGE.rebuild(force=True)
