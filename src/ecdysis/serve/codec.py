"""H2 on one served reply, and its wire format between the proxy and the sandboxed worker running the harness's
code (`sandboxed.py`): both sides encode and decode with these functions, so the two cannot drift.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..agent.realize import realize_message
from ..harness.api import Action, ActionContext, Reply, StepState, ToolSpec
from ..harness.api import ToolCall as HarnessCall
from ..harness.repairs import repair_message
from ..harness.tool_calls import validate


@dataclass
class Outcome:
    """H2 on one upstream reply: the realized actions (or the rejection) and what to tell the model."""

    text: str  # the message text after message-stage repairs (calls written as text removed)
    actions: list[Action]
    repairs: list[str]
    reject_rule: str = ""
    feedback: str = ""
    invalid: list[tuple[Action, str, str]] = field(default_factory=list)  # (action, kind, message)

    @property
    def accepted(self) -> bool:
        return not self.reject_rule and not self.invalid


def realize_outcome(realize: Callable[..., Any], repairs: list[Any], reply: Reply, tools: tuple[ToolSpec, ...],
                    turn: int, task_prompt: str) -> Outcome:
    """The library's H2 on one reply (message repairs, `realize`, reply/call/turn repairs) plus validation."""
    ctx = ActionContext(tools, turn, task_prompt, conversational=True)
    repaired, _ = repair_message(repairs, reply, tools)
    realized = realize_message(realize, repairs, reply, ctx)
    if realized.reject is not None:
        return Outcome(repaired.text, [], realized.repairs, realized.reject.rule or "unparsed",
                       realized.reject.feedback)
    invalid = [(a, *problem) for a in realized.actions if (problem := validate(a, tools)) is not None]
    feedback = "\n".join(message for _, _, message in invalid)
    return Outcome(repaired.text, realized.actions, realized.repairs, "", feedback, invalid)


def action_record(a: Action) -> dict[str, Any]:
    return {"tool": a.tool, "input": a.input, "arguments": a.arguments, "call_id": a.call_id}


def action_of(d: dict[str, Any]) -> Action:
    return Action(d["tool"], d.get("input", ""), d.get("arguments"), d.get("call_id", ""))


def state_record(s: StepState) -> dict[str, Any]:
    return {"turn": s.turn, "max_turns": s.max_turns, "action": action_record(s.action),
            "observation": s.observation, "history": [(action_record(a), o) for a, o in s.history]}


def outcome_record(o: Outcome) -> dict[str, Any]:
    """An Outcome as JSON (what the sandboxed worker sends back)."""
    return {"text": o.text, "actions": [action_record(a) for a in o.actions], "repairs": o.repairs,
            "reject_rule": o.reject_rule, "feedback": o.feedback,
            "invalid": [(action_record(a), kind, message) for a, kind, message in o.invalid]}


def outcome_from_record(d: dict[str, Any]) -> Outcome:
    return Outcome(d["text"], [action_of(a) for a in d["actions"]], list(d["repairs"]), d["reject_rule"],
                   d["feedback"], [(action_of(a), kind, message) for a, kind, message in d["invalid"]])


def harness_reply(text: str, calls: list[dict[str, Any]]) -> Reply:
    """An upstream reply ({"id", "name", "arguments"} calls) as the harness's `Reply`."""
    return Reply(text, tuple(HarnessCall(c.get("id", ""), c.get("name", ""), c.get("arguments", "{}"))
                             for c in calls))


def state_of(d: dict[str, Any]) -> StepState:
    return StepState(d["turn"], d["max_turns"], action_of(d["action"]), d["observation"],
                     [(action_of(a), o) for a, o in d["history"]])
