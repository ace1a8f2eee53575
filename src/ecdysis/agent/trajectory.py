"""The record of one episode. Plain dataclasses: the agent loop fills one in the sandbox; the host builds the
stored record from what the agent reported and what the host itself served and saw (`sandbox.ledger`).

Its events are written and stored as JSON objects; the host reads them as typed records (`events.py`)
through `typed_events` and `of`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from .events import ActionEvent, BaseEvent, ModelEvent, ObservationEvent, PromptEvent, parse_event

E = TypeVar("E", bound=BaseEvent)

# How an episode ended. Everything except "answered" is a failure mode worth aggregating. The sandbox reports
# only how the agent's side ended (`sandbox.protocol.AGENT_ENDINGS`); timeout, infra_error and budget are the
# host's verdicts, and a channel the worker broke is a crash.
TERMINATIONS = (
    "answered",  # the harness realized a final answer (it may still be wrong)
    "max_turns",  # the turn budget ran out
    "rejected",  # H2 rejected too many replies in a row
    "stopped",  # H4 stopped the episode
    "timeout",  # the task's wall-clock limit
    "crash",  # harness code raised, the worker died or hit a resource limit, or it broke the channel's protocol
    "model_error",  # the model backend failed for good
    "user_stop",  # the simulated user ended the conversation (graded like "answered")
    "done",  # the environment ended the episode after an action (its `done` became true)
    "infra_error",  # the executor lost the episode (a Ray worker or node, or its zygote, died): not a harness failure
    "budget",  # a model call over the episode's budget (its harness's turns and samples) or the run's was refused
)
INFRA_ERROR = "infra_error"


def digest(value: Any) -> str:
    """A stable hash of JSON-able data (what a simulated user saw, for exact replay)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:20]


@dataclass
class Trajectory:
    task_id: str
    trial: int
    harness_id: str
    events: list[dict[str, Any]] = field(default_factory=list)
    final_answer: str | None = None
    termination: str = "crash"
    score: float = 0.0
    passed: bool = False
    score_detail: str = ""
    score_components: dict[str, Any] = field(default_factory=dict)
    final_state: dict[str, Any] = field(default_factory=dict)
    conversation: list[dict[str, Any]] = field(default_factory=list)  # messages after the system prompt/demos
    wall_s: float = 0.0
    model_time_s: float = 0.0
    model_calls: int = 0
    cache_hits: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    traceback: str | None = None
    isolation: str = ""

    def add(self, kind: str, turn: int, **data: Any) -> None:
        self.events.append({"kind": kind, "turn": turn, **data})

    def typed_events(self) -> list[BaseEvent]:
        """The events as typed records. Parsed once per length of `events`: readers run after an episode
        is recorded (events are appended, never edited, once they are read)."""
        cached: tuple[int, list[BaseEvent]] | None = self.__dict__.get("_typed")
        if cached is None or cached[0] != len(self.events):
            cached = (len(self.events), [parse_event(e) for e in self.events])
            self.__dict__["_typed"] = cached
        return cached[1]

    def of(self, cls: type[E]) -> list[E]:
        """The events of one record type, in order (e.g. `traj.of(ModelEvent)`)."""
        return [e for e in self.typed_events() if type(e) is cls]

    def tool_calls(self) -> list[ActionEvent]:
        """The actions that called a tool (not the final answer, not a message to the user)."""
        return [e for e in self.of(ActionEvent) if e.is_tool_call]

    def replies(self) -> list[str]:
        return [e.reply for e in self.of(ModelEvent)]

    def reply_records(self) -> list[dict[str, Any]]:
        """Replies with their native tool calls, as replay takes them (of self-consistency samples, only
        the one the vote chose)."""
        return [{"text": e.reply, "tool_calls": e.tool_calls} for e in self.of(ModelEvent) if not e.unchosen]

    def observations_before_replies(self) -> list[str]:
        """For each reply of `reply_records`, the environment's last observation before it ("" before any):
        what `ActionContext.last_observation` held when the reply was realized."""
        out, last = [], ""
        for e in self.typed_events():
            if isinstance(e, ObservationEvent):
                last = e.text
            elif isinstance(e, ModelEvent) and not e.unchosen:
                out.append(last)
        return out

    def offered_tools(self) -> list[dict[str, Any]] | list[str]:
        """The tools the episode offered, as recorded (with schemas); for trajectories recorded before
        tools were stored, the names of the tools it called."""
        prompt = self.of(PromptEvent)
        if prompt and prompt[0].tools is not None:
            return prompt[0].tools
        return sorted({e.tool for e in self.tool_calls()})

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        """The stored event objects of one kind, as written (for writers that amend them; readers use `of`)."""
        return [e for e in self.events if e["kind"] == kind]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trajectory:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)
