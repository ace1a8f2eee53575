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

The harness's own Python layers (`action.py`, `regulate.py`: model-written) run sandboxed, in a worker
process per conversation (`sandboxed.py`), never in the proxy that holds the upstream's keys, unless
`code="inprocess"` (`serve --trust-harness-code`: for a harness you reviewed; its module state is then shared
by every conversation). The library's layers run here, and the host validates H2's actions against the
request's tools itself. A harness that fails to load (here or in its sandbox) raises `HarnessError` naming
the file.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tempfile
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
from .messages import CallRecord, Realized, RealizeRequest, RegulateRequest, StateRecord, Verdicts
from .sandboxed import LayerCodeError, Lineage, SandboxedLayers, request_id


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


def _load_module(path: Path, name: str, shown: Path) -> ModuleType:
    """The agent loop's module loader, its failures as a HarnessError naming the file (`shown`)."""
    try:
        return load_module(path, name)
    except Exception as exc:
        raise HarnessError(f"{shown}: failed to import: {exc.__class__.__name__}: {exc}") from exc


def _layer_function(harness: HarnessVersion, code_root: Path, shown_root: Path, layer: str,
                    function: str) -> Callable[..., Any] | None:
    """The layer's function imported from `code_root` (errors name the file under `shown_root`)."""
    rel = getattr(harness.manifest.files, layer)
    if not rel:
        return None
    module = _load_module(code_root / rel, f"ecdysis_served_{layer}_{harness.id}", shown_root / rel)
    fn = getattr(module, function, None)
    if not callable(fn):
        raise HarnessError(f"{shown_root / rel}: must define {function}() (the {layer} layer interface)")
    return fn


class ServedHarness:
    """One harness directory, loaded once and applied to every request."""

    def __init__(self, directory: Path | str, code: Literal["sandbox", "inprocess"] = "sandbox",
                 concurrency: int = 16) -> None:
        self.root = Path(directory).resolve()
        self.version = load_harness(self.root)
        m = self.version.manifest
        if m.mode == "freeform":
            raise HarnessError(f"{self.root}: a free-form harness drives its own loop; `serve` applies layered "
                               "harnesses only (mode = 'layered')")
        self.sandbox: SandboxedLayers | None = None
        self._code_root: Path | None = None  # in-process: the private copy the layers were imported from
        self._realize: Callable[..., Any] | None = native_realize
        self._regulate: Callable[..., Any] | None = None
        self.has_action, self.has_regulate = bool(m.files.action), bool(m.files.regulate)
        if code == "sandbox" and (self.has_action or self.has_regulate):
            self.sandbox = SandboxedLayers(self.version.files, concurrency)
            try:
                self.isolation = self.sandbox.start()
            except LayerCodeError as exc:
                self.sandbox.close()
                raise HarnessError(f"{self.root}: {exc}") from exc
            self._realize = None if self.has_action else native_realize
        elif self.has_action or self.has_regulate:
            self.isolation = "in-process"
            # the code imported is the version checked and hashed above (a private copy), never the folder again
            self._code_root = self.version.write(Path(tempfile.mkdtemp(prefix="ecdysis-serve-code-")))
            if str(self._code_root) not in sys.path:  # harness modules may import their siblings, as in the sandbox
                sys.path.insert(0, str(self._code_root))
            try:
                self._realize = _layer_function(self.version, self._code_root, self.root, "action",
                                                "realize") or native_realize
                self._regulate = _layer_function(self.version, self._code_root, self.root, "regulate", "regulate")
            except HarnessError:
                self._remove_code()
                raise
        else:
            self.isolation = "no harness code"
        self.repairs = parse_repairs(self.version.files.get(REPAIRS_FILE))
        self.demos = parse_demos(self.version.layer_text("demos"))
        self.manifest = self.version.manifest
        self._prompts: dict[tuple[str, str], tuple[str, str, list[str]]] = {}
        self._verdict_cache: dict[str, Verdict] = {}  # in-process H4 verdicts by state digest (sandboxed: per worker)

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
    async def prepare(self, messages: list[Message], tools: tuple[ToolSpec, ...], lineage: Lineage | None = None
                      ) -> Prepared:
        """The upstream request's messages: contract and tips merged, demos inserted, tool results regulated.
        `lineage`: the request's place in its conversation (which sandboxed worker serves it, until `end_turn`);
        None: a fresh worker per call."""
        agent_system = "\n\n".join(m.content for m in messages if m.role == "system" and m.content)
        rest = [m for m in messages if m.role != "system"]
        first_user = next((m.content for m in rest if m.role == "user"), "")
        contract, tips, skill_ids = self._system(tools, first_user)
        system = "\n\n".join(part for part in (contract, agent_system) if part)
        rest, annotations, stop, observations = await self.regulate_results(rest, lineage)
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

    async def regulate_results(self, messages: list[Message], lineage: Lineage | None = None
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
        verdicts = await self._verdicts([state for _, state in states], lineage)
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

    async def _verdicts(self, states: list[StepState], lineage: Lineage | None) -> list[Verdict]:
        """H4's verdict on each state. A tool result already regulated at this point of a conversation (same
        call, result and history: every later turn sends it again) is answered from a cache, so each request
        regulates only its new results. Sandboxed, the cache is the conversation's worker's own: a verdict
        may encode anything that worker saw, so no other conversation ever gets it."""
        keys = [_state_key(s) for s in states]
        if self.sandbox is None:
            cache = self._verdict_cache
        else:
            cache = (await self.sandbox.bind(lineage)).verdicts if lineage is not None else {}
        missing = [i for i, key in enumerate(keys) if key not in cache]
        fresh = dict(zip(missing, await self._regulate_states([states[i] for i in missing], lineage), strict=True)
                     ) if missing else {}
        out = [fresh[i] if i in fresh else cache[key] for i, key in enumerate(keys)]
        if len(cache) > 10_000:
            cache.clear()
        cache.update((keys[i], verdict) for i, verdict in fresh.items())
        return out

    async def _regulate_states(self, states: list[StepState], lineage: Lineage | None) -> list[Verdict]:
        if self.sandbox is not None:
            try:
                reply = await self.sandbox.call(RegulateRequest(id=request_id(),
                                                                states=[StateRecord.of(s) for s in states]), lineage)
            except LayerCodeError as exc:
                raise HarnessRuntimeError(f"H4 regulate(): {exc}") from exc
            assert isinstance(reply, Verdicts)
            return [v.verdict() for v in reply.verdicts]
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
    async def realize(self, reply: Reply, tools: tuple[ToolSpec, ...], turn: int, task_prompt: str,
                      lineage: Lineage | None = None) -> Outcome:
        """H2 on one upstream reply against the request's tools: repairs, realize, validation. `lineage`: the
        request's place in its conversation (None: a sandboxed worker of its own)."""
        if self._realize is not None:
            try:
                return realize_outcome(self._realize, self.repairs, reply, tools, turn, task_prompt)
            except Exception as exc:
                raise HarnessRuntimeError(f"H2 realize() raised: {traceback.format_exception_only(exc)[-1].strip()}"
                                          ) from exc
        assert self.sandbox is not None
        request = RealizeRequest(id=request_id(), text=reply.text, turn=turn, task=task_prompt,
                                 calls=[CallRecord(id=c.id, name=c.name, arguments=c.arguments)
                                        for c in reply.tool_calls],
                                 tools=[t.to_record() for t in tools])
        try:
            realized = await self.sandbox.call(request, lineage)
        except LayerCodeError as exc:
            raise HarnessRuntimeError(f"H2 realize(): {exc}") from exc
        assert isinstance(realized, Realized)
        outcome = Outcome(realized.text, [a.action() for a in realized.actions], realized.repairs,
                          realized.reject_rule, realized.feedback)
        return validated(outcome, tools)

    async def end_turn(self, lineage: Lineage, reply: Message | None) -> None:
        """The request is over (`reply`: what the client got, None if it failed): its sandboxed worker is kept
        for the conversation's next request, or ended."""
        if self.sandbox is not None:
            await self.sandbox.end_turn(lineage, reply)

    async def aclose(self) -> None:
        if self.sandbox is not None:
            await self.sandbox.aclose()
        self._remove_code()

    def close(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()
        self._remove_code()

    def _remove_code(self) -> None:
        if self._code_root is not None:
            shutil.rmtree(self._code_root, ignore_errors=True)
            self._code_root = None


def realized_outcome(realize: Callable[..., Any], repairs: list[Any], reply: Reply, tools: tuple[ToolSpec, ...],
                     turn: int, task_prompt: str, ctx: ActionContext | None = None) -> Outcome:
    """The library's H2 on one reply (message repairs, `realize`, reply/call/turn repairs), not yet validated.
    `ctx` replaces the default context (a conversation: text goes to the user), e.g. for a task's agent."""
    ctx = ctx or ActionContext(tools, turn, task_prompt, conversational=True)
    repaired, _ = repair_message(repairs, reply, tools)
    realized = realize_message(realize, repairs, reply, ctx)
    if realized.reject is not None:
        return Outcome(repaired.text, [], realized.repairs, realized.reject.rule or "unparsed",
                       realized.reject.feedback)
    return Outcome(repaired.text, realized.actions, realized.repairs)


def validated(outcome: Outcome, tools: tuple[ToolSpec, ...]) -> Outcome:
    """The outcome with its actions checked against the request's tools (run by the host: harness code in the
    sandbox does not decide which of its calls are valid)."""
    if outcome.reject_rule:
        return outcome
    invalid = [(a, *problem) for a in outcome.actions if (problem := validate(a, tools)) is not None]
    feedback = "\n".join(message for _, _, message in invalid)
    return Outcome(outcome.text, outcome.actions, outcome.repairs, "", feedback, invalid)


def realize_outcome(realize: Callable[..., Any], repairs: list[Any], reply: Reply, tools: tuple[ToolSpec, ...],
                    turn: int, task_prompt: str, ctx: ActionContext | None = None) -> Outcome:
    """The library's H2 on one reply (message repairs, `realize`, reply/call/turn repairs) plus validation."""
    return validated(realized_outcome(realize, repairs, reply, tools, turn, task_prompt, ctx), tools)


def demo_message(d: dict[str, Any]) -> Message:
    """A demonstration message (from `parse_demos`) with its tool calls and call id kept, so a demonstrated
    exchange of calls and results reaches the model as real calls."""
    calls = d.get("tool_calls") or None
    if calls:
        calls = [{"id": c.get("id", ""), "name": c.get("name") or (c.get("function") or {}).get("name", ""),
                  "arguments": c.get("arguments") or (c.get("function") or {}).get("arguments", "{}")} for c in calls]
    return Message(role=d["role"], content=d.get("content") or "", tool_calls=calls,
                   tool_call_id=d.get("tool_call_id") if d["role"] == "tool" else None)


def harness_reply(text: str, calls: list[dict[str, Any]]) -> Reply:
    """An upstream reply ({"id", "name", "arguments"} calls) as the harness's `Reply`."""
    return Reply(text, tuple(HarnessCall(c.get("id", ""), c.get("name", ""), c.get("arguments", "{}"))
                             for c in calls))


def retry_messages(reply_text: str, calls: list[dict[str, Any]], outcome: Outcome) -> list[Message]:
    """What the upstream model is told after a rejected or invalid reply: its reply, then the feedback
    (a rejection as a user message; invalid calls as their tool results, the valid ones not run)."""
    from ..models.base import ModelToolCall

    if outcome.reject_rule or not calls:
        return [Message(role="assistant", content=reply_text),
                Message(role="user", content=outcome.feedback or "Your reply could not be used. Try again.")]
    bad = {a.call_id: message for a, _, message in outcome.invalid}
    out = [Message(role="assistant", content=reply_text,
                   tool_calls=[ModelToolCall(id=c["id"], name=c["name"], arguments=c["arguments"]) for c in calls])]
    for c in calls:
        out.append(Message(role="tool", tool_call_id=c["id"], content=bad.get(
            c["id"], "(not run: another call in this message was invalid; send the corrected calls again)")))
    return out


def _state_key(s: StepState) -> str:
    """A digest of everything H4 sees of one state."""
    def action(a: Action) -> list[Any]:
        return [a.tool, a.input, a.arguments, a.call_id]

    record = [s.turn, s.max_turns, action(s.action), s.observation, [(action(a), o) for a, o in s.history]]
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


def arguments_text(action: Action) -> str:
    return json.dumps(action.arguments) if action.arguments is not None else (action.input or "{}")
