"""A frozen harness applied to an agent's Chat Completions requests (the library's layers, reused).

- H3/H5 `prepare`: the contract (tools filled in, always-on tips) goes first in the system message,
  then the agent's own system text; demonstrations follow it; tips retrieved for the conversation's
  first user message go in front of that message. Everything before the agent's conversation is
  the same for every conversation with the same tools, so prefix caches keep hitting.
- H4 `regulate_results`: every tool result the agent sends back is passed through the harness's
  `regulate` with the call it answers and the results before it; annotations are appended (the
  same ones on every request, so the prefix stays stable); a stop on the newest results is returned.
- H2 `realize`: the library's `realize_message` (repairs before and after the harness's `realize`,
  per-call repairs) plus schema validation, against the request's tools.

The harness's own Python layers (`action.py`, `regulate.py`: model-written) run in a long-lived sandboxed
worker (`sandboxed.py`), never in the proxy that holds the upstream's keys, unless `code="inprocess"`
(`serve --trust-harness-code`: faster, for a harness you reviewed). The library's layers run here. A harness
that fails to load (here or in its sandbox) raises `HarnessError` naming the file.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from ..agent.loop import build_system_prompt, load_module
from ..agent.realize import realize_message
from ..harness.api import Action, ActionContext, Reply, StepState, ToolSpec, Verdict
from ..harness.api import ToolCall as HarnessCall
from ..harness.manifest import HarnessError, HarnessVersion, load_harness
from ..harness.repairs import REPAIRS_FILE, parse_repairs, repair_message
from ..harness.skills import parse_demos
from ..harness.tool_calls import native_realize, parse_arguments, validate
from ..models.base import Message
from .sandboxed import LayerCodeError, SandboxedLayers, probe


class HarnessRuntimeError(RuntimeError):
    """Harness code raised while serving a request (HTTP 500; the message names the layer)."""


@dataclass
class Prepared:
    """The request as the upstream model gets it, and what the harness added."""

    messages: list[Message]
    system: str
    tips: str
    skills: list[str]
    task_prompt: str
    annotations: list[str] = field(default_factory=list)  # H4 annotations on the newest tool results
    stop: Verdict | None = None  # H4 asked to stop after the newest tool results
    observations: list[dict[str, Any]] = field(default_factory=list)  # newest tool results (tool, text)


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


def _load_module(path: Path, name: str) -> ModuleType:
    """The agent loop's module loader, its failures as a HarnessError naming the file."""
    try:
        return load_module(path, name)
    except Exception as exc:
        raise HarnessError(f"{path}: failed to import: {exc.__class__.__name__}: {exc}") from exc


def _layer_function(harness: HarnessVersion, root: Path, layer: str, function: str) -> Callable[..., Any] | None:
    rel = getattr(harness.manifest.files, layer)
    if not rel:
        return None
    module = _load_module(root / rel, f"ecdysis_served_{layer}_{harness.id}")
    fn = getattr(module, function, None)
    if not callable(fn):
        raise HarnessError(f"{root / rel}: must define {function}() (the {layer} layer interface)")
    return fn


class ServedHarness:
    """One harness directory, loaded once and applied to every request."""

    def __init__(self, directory: Path | str, code: Literal["sandbox", "inprocess"] = "sandbox") -> None:
        self.root = Path(directory).resolve()
        self.version = load_harness(self.root)
        m = self.version.manifest
        if m.mode == "freeform":
            raise HarnessError(f"{self.root}: a free-form harness drives its own loop; `serve` applies layered "
                               "harnesses only (mode = 'layered')")
        self.sandbox: SandboxedLayers | None = None
        self._realize: Callable[..., Any] | None = native_realize
        self._regulate: Callable[..., Any] | None = None
        self.has_action, self.has_regulate = bool(m.files.action), bool(m.files.regulate)
        if code == "sandbox" and (self.has_action or self.has_regulate):
            try:
                self.isolation = probe(self.version.files)
            except LayerCodeError as exc:
                raise HarnessError(f"{self.root}: {exc}") from exc
            self.sandbox = SandboxedLayers(self.version.files)
            self._realize = None if self.has_action else native_realize
        else:
            self.isolation = "in-process" if (self.has_action or self.has_regulate) else "no harness code"
            if str(self.root) not in sys.path:  # harness modules may import their siblings, as in the sandbox
                sys.path.insert(0, str(self.root))
            self._realize = _layer_function(self.version, self.root, "action", "realize") or native_realize
            self._regulate = _layer_function(self.version, self.root, "regulate", "regulate")
        self.repairs = parse_repairs(self.version.files.get(REPAIRS_FILE))
        self.demos = parse_demos(self.version.layer_text("demos"))
        self.manifest = self.version.manifest
        self._prompts: dict[tuple[str, str], tuple[str, str, list[str]]] = {}
        self._verdict_cache: dict[str, Verdict] = {}

    def _system(self, tools: tuple[ToolSpec, ...], first_user: str) -> tuple[str, str, list[str]]:
        """`build_system_prompt` for (tools, first user message), kept: every turn of a conversation asks again."""
        key = (json.dumps([t.to_record() for t in tools], sort_keys=True), first_user)
        hit = self._prompts.get(key)
        if hit is None:
            hit = build_system_prompt(self.version, tools, first_user)
            if len(self._prompts) >= 4096:
                self._prompts.clear()
            self._prompts[key] = hit
        return hit

    def _examples(self, query: str) -> list[dict[str, Any]]:
        """Retrieved worked examples (the `examples` layer), where this library version has it."""
        from ..harness import skills

        fn = getattr(skills, "example_messages", None)
        return fn(self.version.layer_text("examples"), query) if fn is not None and query else []

    @property
    def id(self) -> str:
        return self.version.id

    @property
    def name(self) -> str:
        return self.manifest.name

    # H3 + H5 + H4 ---------------------------------------------------------------------------------
    async def prepare(self, messages: list[Message], tools: tuple[ToolSpec, ...]) -> Prepared:
        """The upstream request's messages: contract and tips merged, demos inserted, tool results regulated."""
        agent_system = "\n\n".join(m.content for m in messages if m.role == "system" and m.content)
        rest = [m for m in messages if m.role != "system"]
        first_user = next((m.content for m in rest if m.role == "user"), "")
        contract, tips, skill_ids = self._system(tools, first_user)
        system = "\n\n".join(part for part in (contract, agent_system) if part)
        rest, annotations, stop, observations = await self.regulate_results(rest)
        out = [Message(role="system", content=system)] if system else []
        out += [demo_message(d) for d in self.demos]
        out += [Message(role=d["role"], content=d["content"]) for d in self._examples(first_user)]
        tipped = False
        for m in rest:
            if tips and not tipped and m.role == "user":
                m = m.model_copy(update={"content": f"{tips}\n\n{m.content}"})
                tipped = True
            out.append(m)
        return Prepared(out, system, tips, skill_ids, first_user, annotations, stop, observations)

    async def regulate_results(self, messages: list[Message]
                               ) -> tuple[list[Message], list[str], Verdict | None, list[dict[str, Any]]]:
        """H4 over every tool result; returns (messages, newest annotations, newest stop, newest results)."""
        last_assistant = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=-1)
        calls: dict[str, Action] = {}
        history: list[tuple[Action, str]] = []
        states: list[tuple[int, StepState]] = []  # (message index, state)
        observations: list[dict[str, Any]] = []
        turn = 0
        for index, m in enumerate(messages):
            if m.role == "assistant":
                turn += 1
                for c in m.tool_calls or []:
                    args = parse_arguments(c.arguments)
                    calls[c.id] = Action(c.name, "" if args is not None else c.arguments, args, c.id)
            if m.role != "tool":
                continue
            action = calls.get(m.tool_call_id or "", Action("unknown", "", None, m.tool_call_id or ""))
            if index > last_assistant:
                observations.append({"tool": action.tool, "arguments": action.arguments, "text": m.content})
            states.append((index, StepState(max(0, turn - 1), self.manifest.budget.max_turns, action, m.content,
                                            list(history))))
            history.append((action, m.content))
        if not states or not self.has_regulate:
            return messages, [], None, observations
        verdicts = await self._verdicts([state for _, state in states])
        out = list(messages)
        newest: list[str] = []
        stop: Verdict | None = None
        for (index, _), verdict in zip(states, verdicts, strict=True):
            fresh = index > last_assistant
            if verdict.annotation:
                out[index] = out[index].model_copy(update={"content": f"{out[index].content}\n{verdict.annotation}"})
                if fresh:
                    newest.append(verdict.annotation)
            if fresh and verdict.stop and stop is None:
                stop = verdict
        return out, newest, stop, observations

    async def _verdicts(self, states: list[StepState]) -> list[Verdict]:
        """H4's verdict on each state. A tool result already regulated at this point of a conversation (same
        call, result and history: every later turn sends it again) is answered from a cache, so each request
        regulates only its new results."""
        records = [json.dumps(_state_record(s), sort_keys=True) for s in states]
        missing = [i for i, key in enumerate(records) if key not in self._verdict_cache]
        if missing:
            fresh = await self._regulate_states([states[i] for i in missing])
            if len(self._verdict_cache) > 50_000:
                self._verdict_cache.clear()
            for i, verdict in zip(missing, fresh, strict=True):
                self._verdict_cache[records[i]] = verdict
        return [self._verdict_cache[key] for key in records]

    async def _regulate_states(self, states: list[StepState]) -> list[Verdict]:
        if self.sandbox is not None:
            try:
                raw = await self.sandbox.call("regulate", {"states": [_state_record(s) for s in states]})
            except LayerCodeError as exc:
                raise HarnessRuntimeError(f"H4 regulate(): {exc}") from exc
            return [Verdict(v["annotation"], bool(v["stop"]), v["reason"]) for v in raw]
        out = []
        for state in states:
            try:
                verdict = self._regulate(state) if self._regulate is not None else Verdict()
            except Exception as exc:
                raise HarnessRuntimeError(f"H4 regulate() raised: {traceback.format_exception_only(exc)[-1].strip()}"
                                          ) from exc
            if not isinstance(verdict, Verdict):
                raise HarnessRuntimeError(f"H4 regulate() must return a Verdict, got {verdict!r}")
            out.append(verdict)
        return out

    # H2 -------------------------------------------------------------------------------------------
    async def realize(self, reply: Reply, tools: tuple[ToolSpec, ...], turn: int, task_prompt: str) -> Outcome:
        """H2 on one upstream reply against the request's tools: repairs, realize, validation."""
        if self._realize is not None:
            try:
                return realize_outcome(self._realize, self.repairs, reply, tools, turn, task_prompt)
            except Exception as exc:
                raise HarnessRuntimeError(f"H2 realize() raised: {traceback.format_exception_only(exc)[-1].strip()}"
                                          ) from exc
        assert self.sandbox is not None
        calls = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in reply.tool_calls]
        try:
            raw = await self.sandbox.call("realize", {"text": reply.text, "calls": calls, "turn": turn,
                                                      "task": task_prompt, "tools": [t.to_record() for t in tools]})
        except LayerCodeError as exc:
            raise HarnessRuntimeError(f"H2 realize(): {exc}") from exc
        return outcome_from_record(raw)

    async def aclose(self) -> None:
        if self.sandbox is not None:
            await self.sandbox.aclose()

    def close(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()


def realize_outcome(realize: Callable[..., Any], repairs: list[Any], reply: Reply, tools: tuple[ToolSpec, ...],
                    turn: int, task_prompt: str, ctx: ActionContext | None = None) -> Outcome:
    """The library's H2 on one reply (message repairs, `realize`, reply/call/turn repairs) plus validation.
    `ctx` replaces the default context (a conversation: text goes to the user), e.g. for a task's agent."""
    ctx = ctx or ActionContext(tools, turn, task_prompt, conversational=True)
    repaired, _ = repair_message(repairs, reply, tools)
    realized = realize_message(realize, repairs, reply, ctx)
    if realized.reject is not None:
        return Outcome(repaired.text, [], realized.repairs, realized.reject.rule or "unparsed",
                       realized.reject.feedback)
    invalid = [(a, *problem) for a in realized.actions if (problem := validate(a, tools)) is not None]
    feedback = "\n".join(message for _, _, message in invalid)
    return Outcome(repaired.text, realized.actions, realized.repairs, "", feedback, invalid)


def demo_message(d: dict[str, Any]) -> Message:
    """A demonstration message (from `parse_demos`) with its tool calls and call id kept, so a demonstrated
    exchange of calls and results reaches the model as real calls."""
    calls = d.get("tool_calls") or None
    if calls:
        calls = [{"id": c.get("id", ""), "name": c.get("name") or (c.get("function") or {}).get("name", ""),
                  "arguments": c.get("arguments") or (c.get("function") or {}).get("arguments", "{}")} for c in calls]
    return Message(role=d["role"], content=d.get("content") or "", tool_calls=calls,
                   tool_call_id=d.get("tool_call_id") if d["role"] == "tool" else None)


def _action_record(a: Action) -> dict[str, Any]:
    return {"tool": a.tool, "input": a.input, "arguments": a.arguments, "call_id": a.call_id}


def _action_of(d: dict[str, Any]) -> Action:
    return Action(d["tool"], d.get("input", ""), d.get("arguments"), d.get("call_id", ""))


def _state_record(s: StepState) -> dict[str, Any]:
    return {"turn": s.turn, "max_turns": s.max_turns, "action": _action_record(s.action),
            "observation": s.observation, "history": [(_action_record(a), o) for a, o in s.history]}


def outcome_record(o: Outcome) -> dict[str, Any]:
    """An Outcome as JSON (what the sandboxed worker sends back)."""
    return {"text": o.text, "actions": [_action_record(a) for a in o.actions], "repairs": o.repairs,
            "reject_rule": o.reject_rule, "feedback": o.feedback,
            "invalid": [(_action_record(a), kind, message) for a, kind, message in o.invalid]}


def outcome_from_record(d: dict[str, Any]) -> Outcome:
    return Outcome(d["text"], [_action_of(a) for a in d["actions"]], list(d["repairs"]), d["reject_rule"],
                   d["feedback"], [(_action_of(a), kind, message) for a, kind, message in d["invalid"]])


def harness_reply(text: str, calls: list[dict[str, Any]]) -> Reply:
    """An upstream reply ({"id", "name", "arguments"} calls) as the harness's `Reply`."""
    return Reply(text, tuple(HarnessCall(c.get("id", ""), c.get("name", ""), c.get("arguments", "{}"))
                             for c in calls))


def retry_messages(reply_text: str, calls: list[dict[str, Any]], outcome: Outcome) -> list[Message]:
    """What the upstream model is told after a rejected or invalid reply: its reply, then the feedback
    (a rejection as a user message; invalid calls as their tool results, the valid ones not run)."""
    from ..models.base import ToolCall

    if outcome.reject_rule or not calls:
        return [Message(role="assistant", content=reply_text),
                Message(role="user", content=outcome.feedback or "Your reply could not be used. Try again.")]
    bad = {a.call_id: message for a, _, message in outcome.invalid}
    out = [Message(role="assistant", content=reply_text,
                   tool_calls=[ToolCall(id=c["id"], name=c["name"], arguments=c["arguments"]) for c in calls])]
    for c in calls:
        out.append(Message(role="tool", tool_call_id=c["id"], content=bad.get(
            c["id"], "(not run: another call in this message was invalid; send the corrected calls again)")))
    return out


def arguments_text(action: Action) -> str:
    return json.dumps(action.arguments) if action.arguments is not None else (action.input or "{}")
