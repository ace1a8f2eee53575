"""H2 on one assistant message: repairs before and after the harness's `realize`, then per-call fixes.

Shared by the live loop and by replay (stored replies re-realized with a candidate harness), so a
replayed reply is realized exactly as it would be live.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..harness.api import Action, ActionContext, Reject, Reply, ToolCall
from ..harness.repairs import Repair, repair_answer, repair_call, repair_message, repair_turn, try_repairs
from ..harness.tool_calls import validate

RealizeFn = Callable[[Reply, ActionContext], Any]


@dataclass
class Realized:
    """The outcome of H2 on one message: actions to run, or a rejection; and the repairs that fired."""

    actions: list[Action] = field(default_factory=list)
    reject: Reject | None = None
    repairs: list[str] = field(default_factory=list)


def as_reply(stored: str | dict[str, Any]) -> Reply:
    """A stored model reply (text, or {"text", "tool_calls"}) as a `Reply`."""
    if isinstance(stored, str):
        return Reply(stored)
    calls = tuple(ToolCall(c.get("id", ""), c.get("name", ""), c.get("arguments", "{}"))
                  for c in stored.get("tool_calls") or [])
    return Reply(stored.get("text", ""), calls)


def realize_message(realize: RealizeFn, repairs: list[Repair], reply: Reply, ctx: ActionContext) -> Realized:
    """Run H2. Raises TypeError if harness code returns something other than Action(s) or Reject."""
    out = Realized()
    reply, fixed_by = repair_message(repairs, reply, ctx.tools)
    if fixed_by:
        out.repairs.append(fixed_by)
    result = realize(reply, ctx)
    if isinstance(result, Reject) and repairs:
        repaired = try_repairs(repairs, reply, ctx.tools)
        if repaired is not None:
            result, name = repaired
            out.repairs.append(name)
    if isinstance(result, Reject):
        out.reject = result
        return out
    actions = [result] if isinstance(result, Action) else result
    if not isinstance(actions, list) or not actions or not all(isinstance(a, Action) for a in actions):
        raise TypeError(f"realize() must return an Action, a non-empty list of Actions or a Reject, got {result!r}")
    actions, turn_fix = repair_turn(repairs, actions)
    if turn_fix:
        out.repairs.append(turn_fix)
    for action in actions:
        if action.is_answer:
            fixed_answer, name = repair_answer(repairs, action, ctx)
            if name:
                out.repairs.append(name)
            if isinstance(fixed_answer, Reject):
                out.reject, out.actions = fixed_answer, []
                return out
            action = fixed_answer
        if validate(action, ctx.tools) is not None:
            fixed, used = repair_call(repairs, action, ctx.tools)
            if used and validate(fixed, ctx.tools) is None:
                action = fixed
                out.repairs.extend(used)
        out.actions.append(action)
    return out


def replay_item(realize: RealizeFn, repairs: list[Repair], item: dict[str, Any]) -> list[dict[str, Any]]:
    """Re-realize one stored episode's replies (`item`: prompt, replies, tools, conversational, choices and the
    observation before each reply) with a candidate's H2, without model calls: per reply {"reject": rule} or
    {"actions": [...], "repairs": [...]}."""
    from ..harness.api import ToolSpec

    tools = tuple(ToolSpec.from_record(t) for t in item["tools"])
    choices = tuple(str(c) for c in item.get("choices") or ())
    observations = list(item.get("observations") or [])
    out: list[dict[str, Any]] = []
    for turn, reply in enumerate(item["replies"]):
        seen = observations[turn] if turn < len(observations) else ""
        ctx = ActionContext(tools, turn, item["prompt"], bool(item.get("conversational")), choices, seen)
        realized = realize_message(realize, repairs, as_reply(reply), ctx)
        if realized.reject is not None:
            out.append({"reject": realized.reject.rule})
        else:
            out.append({"actions": [{"tool": a.tool, "input": a.input, "arguments": a.arguments,
                                     "invalid": (validate(a, tools) or (None,))[0]}
                                    for a in realized.actions], "repairs": realized.repairs})
    return out
