"""The host's ledger of one episode: the calls it served, the budget they count against, and the trajectory
built from them and the worker's report.

Every field of the recorded trajectory that the host can know comes from the host: task, trial and harness
from its own request, isolation from what it started the worker under, model call and token counts, model
time and cache hits from the calls it served. A `model` or `user` event of the worker's report names the
call it stands for; the host fills that call's messages, reply and accounting in from its own record. An
event naming a call the host never served (or naming it twice), or an ending the host cannot have caused, is
a protocol violation (`ProtocolError`), which the caller records as the episode's `crash`.
"""

from __future__ import annotations

import contextlib
import signal
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ..agent.trajectory import Trajectory, digest
from .framing import ProtocolError
from .protocol import CALL_KINDS, EpisodeReport

MAX_TRACEBACK = 20_000  # characters of a worker's traceback or stderr kept in the record


class BudgetExceeded(Exception):
    """A model call over the episode's budget (or the run's): refused; the episode ends `budget`."""


class Served(BaseModel):
    """A host handler's answer to a model call: the reply with its accounting, an error, or a refusal."""

    model_config = ConfigDict(extra="ignore")
    text: str = ""
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)
    finish_reason: str = ""
    usage: dict[str, int] = Field(default_factory=dict)
    latency_s: float = 0.0
    cache_hit: bool = False
    retries: int = 0
    error: str | None = None
    refused: str | None = None  # the run's budget is spent: the call was not made

    def event_fields(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        return {"messages": messages, "reply": self.text, "tool_calls": self.tool_calls,
                "finish_reason": self.finish_reason, "usage": self.usage, "latency_s": self.latency_s,
                "cache_hit": self.cache_hit, "retries": self.retries}


class UserServed(BaseModel):
    """A host handler's answer to a user turn."""

    model_config = ConfigDict(extra="ignore")
    text: str = ""
    stop: bool = False
    limit: bool = False
    reason: str = ""
    error: str | None = None


@dataclass
class _Call:
    kind: str  # "model" or "user"
    request: Any  # the messages (model) or the conversation (user) as the worker sent them
    served: Served | UserServed

    def event_fields(self) -> dict[str, Any]:
        if isinstance(self.served, Served):
            return self.served.event_fields(self.request)
        return {"text": self.served.text, "stop": self.served.stop, "reason": self.served.reason,
                "seen": digest(self.request)}


@dataclass
class EpisodeLedger:
    """What the host served one episode, in call order, and its budget of model calls (`max_calls`)."""

    task_id: str
    trial: int
    harness_id: str
    max_calls: int
    calls: dict[int, _Call] = field(default_factory=dict)
    model_calls: int = 0  # model calls the episode asked for, served or not
    errors_sent: int = 0  # error replies the host sent (a model or user failure the agent may report)

    def claim(self, call_id: int) -> None:
        """A new call id; a reused one is a protocol violation (replies are matched to calls by id)."""
        if call_id in self.calls:
            raise ProtocolError(f"call id {call_id} was used twice")

    def admit_model_call(self) -> None:
        """Count a model call against the episode's budget; BudgetExceeded if it is over."""
        if self.model_calls >= self.max_calls:
            raise BudgetExceeded(f"the harness allows {self.max_calls} model call(s) per episode (turns, "
                                 "self-consistency samples); one more was asked for and refused")
        self.model_calls += 1

    def model(self, call_id: int, messages: list[dict[str, Any]], served: Served) -> None:
        self.calls[call_id] = _Call("model", messages, served)
        self.errors_sent += served.error is not None

    def user(self, call_id: int, conversation: list[dict[str, str]], served: UserServed) -> None:
        self.calls[call_id] = _Call("user", conversation, served)
        self.errors_sent += served.error is not None

    def _trajectory(self, termination: str, isolation: str) -> Trajectory:
        traj = Trajectory(task_id=self.task_id, trial=self.trial, harness_id=self.harness_id,
                          termination=termination, isolation=isolation)
        for call in self.calls.values():
            served = call.served
            if call.kind != "model" or served.error is not None or not isinstance(served, Served):
                continue
            traj.model_calls += 1
            traj.cache_hits += served.cache_hit
            traj.model_time_s += served.latency_s
            traj.prompt_tokens += int(served.usage.get("prompt_tokens", 0))
            traj.completion_tokens += int(served.usage.get("completion_tokens", 0))
        return traj

    def trajectory(self, report: EpisodeReport, isolation: str) -> Trajectory:
        """The record of an episode that reported back: the agent's events and outcome with the host's fields.
        Raises ProtocolError if the report cites calls the host did not serve or claims a model failure the
        host never sent."""
        if report.ending == "model_error" and not self.errors_sent:
            raise ProtocolError("the episode reported a model failure, but the host sent no error")
        traj = self._trajectory(report.ending, isolation)
        cited: set[int] = set()
        for event in report.events:
            data = event.model_dump()
            if event.kind in CALL_KINDS:
                call = self.calls.get(event.call) if event.call is not None else None
                if call is None or call.kind != event.kind or call.served.error is not None:
                    raise ProtocolError(f"a {event.kind!r} event cites call {event.call}, which the host did not "
                                        f"serve as one")
                if event.call in cited:
                    raise ProtocolError(f"two events cite call {event.call}")
                cited.add(event.call)  # type: ignore[arg-type]
                data.update(call.event_fields())
            elif data.get("call") is None:
                data.pop("call", None)
            traj.events.append(data)
        for call_id, call in self.calls.items():  # calls made around the agent loop: recorded, never replayed
            if call_id not in cited and call.served.error is None:
                traj.events.append({"kind": call.kind, "turn": 0, "call": call_id, **call.event_fields(),
                                    "uncited": True, **({"unchosen": True} if call.kind == "model" else {})})
        traj.final_answer = report.final_answer
        traj.final_state = dict(report.final_state)
        traj.conversation = list(report.conversation)
        traj.traceback = report.traceback[-MAX_TRACEBACK:] if report.traceback else None
        return traj

    def failed(self, termination: str, detail: str, isolation: str, stderr: bytes,
               returncode: int | None) -> Trajectory:
        """The record of an episode that did not report back (or whose report the host refused): the calls
        the host served, why it ended, and the tail of the worker's stderr."""
        traj = self._trajectory(termination, isolation)
        for call_id, call in self.calls.items():
            if call.served.error is None:
                traj.events.append({"kind": call.kind, "turn": 0, "call": call_id, **call.event_fields()})
        traj.traceback = f"{detail}{_signal_note(returncode)}\n--- worker stderr (tail) ---\n" \
                         f"{stderr.decode(errors='replace').strip()[-MAX_TRACEBACK:]}".strip()
        return traj


def _signal_note(returncode: int | None) -> str:
    """` (killed by SIGX)` when the exit status says a signal ended the worker."""
    # a direct child killed by a signal has a negative code; bwrap reports its child's signal as 128 + N
    number = -returncode if returncode is not None and returncode < 0 else (
        returncode - 128 if returncode is not None and 128 < returncode < 128 + 65 else None)
    if number is not None:
        with contextlib.suppress(ValueError):
            return f" (killed by {signal.Signals(number).name})"
    return ""
