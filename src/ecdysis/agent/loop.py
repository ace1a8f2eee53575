"""The library's agent loop: drives the harness layers over one episode and records everything.

It is synchronous and runs inside the sandbox worker; `chat` is the only way out to a model (the
worker forwards it to the host). Exceptions from harness code propagate to the caller, which
records them as a crashed trajectory.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from ..envs.base import Episode
from ..harness.api import Action, ActionContext, Reject, Reply, StepState, ToolSpec, Verdict
from ..harness.manifest import HarnessVersion, Manifest
from ..harness.repairs import REPAIRS_FILE, parse_repairs
from ..harness.skills import example_messages, parse_demos, parse_skills, retrieve
from ..harness.tool_calls import native_realize, openai_tools, validate
from .consistency import vote
from .realize import RealizeFn, as_reply, realize_message
from .trajectory import Trajectory, digest

ChatFn = Callable[[list[dict[str, Any]], dict[str, Any]], dict[str, Any]]
UserFn = Callable[[list[dict[str, str]]], dict[str, Any]]  # conversation -> {"text", "stop"} | {"error"}
GREETING = "Hi! How can I help you today?"


class ModelFailure(RuntimeError):
    """The model backend failed for good; the episode ends as `model_error`."""


class HarnessLoadError(ImportError):
    """A harness file failed to import, or lacks the function its layer needs; the message names the file."""


def load_module(path: Path, name: str) -> ModuleType:
    """Import a harness file; HarnessLoadError naming the file (and the line) when its import raises."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise HarnessLoadError(f"cannot load {path.name}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__) if f.filename == str(path)]
        where = f" (line {lines[-1]})" if lines else ""
        raise HarnessLoadError(f"{path.name} failed to import{where}: {type(exc).__name__}: {exc}") from exc
    return module


def layer_function(module: ModuleType, name: str, path: Path) -> Callable[..., Any]:
    """The function a layer file must define; HarnessLoadError naming the file when it does not."""
    fn = getattr(module, name, None)
    if not callable(fn):
        raise HarnessLoadError(f"{path.name} defines no function {name}() (see ecdysis.harness.api)")
    return fn


def render_tools(tools: tuple[ToolSpec, ...]) -> str:
    """One line per tool; schema tools show their argument names: `- name(a, b): description`."""
    lines = []
    for t in tools:
        signature = t.name if t.parameters is None else f"{t.name}({', '.join(t.parameters.get('properties', {}))})"
        lines.append(f"- {signature}: {t.description}")
    return "\n".join(lines) or "(no tools: answer directly)"


def build_system_prompt(harness: HarnessVersion, tools: tuple[ToolSpec, ...], task_prompt: str,
                        conversational: bool = False) -> tuple[str, str, list[str]]:
    """H3 contract with tools filled in and the always-on H5 tips; and the tips retrieved for this task.
    Returns (system prompt, task tips, skill ids).

    Ordered from most to least shared so prefix caches hit (local KV reuse, hosted prompt caches): the
    system prompt and demonstrations are the same for every task; retrieved tips go with the task in the
    first user message. A conversation opens with the agent's greeting, so its tips stay in the system prompt."""
    contract = (harness.layer_text("contract") or "").replace("{tools}", render_tools(tools))
    skills = retrieve(parse_skills(harness.layer_text("skills")), task_prompt, harness.manifest.budget.top_k_skills)
    always = [s for s in skills if s.trigger.strip() == "*" or conversational]
    task_specific = [s for s in skills if s not in always]
    if always:
        contract += "\n\nTips:\n" + "\n".join(f"- {s.tip}" for s in always)
    tips = "Tips:\n" + "\n".join(f"- {s.tip}" for s in task_specific) if task_specific else ""
    return contract.strip(), tips, [s.id for s in skills]


def max_model_calls(manifest: Manifest) -> int:
    """The most model calls one episode of a harness with this manifest makes; the host refuses any more.

    A layered episode makes one call per turn (a rejected reply uses up its turn: H2's retries are turns), and
    on the one turn whose reply is a final answer, `generation.samples - 1` more for self-consistency (the
    vote's answer ends the episode). A free-form loop is given `max_turns` turns of `samples` calls each."""
    turns, samples = max(manifest.budget.max_turns, 1), manifest.generation.samples
    return turns * samples if manifest.mode == "freeform" else turns + samples - 1


class AgentSession:
    """Model access with accounting; also the `AgentIO` handed to free-form loops."""

    def __init__(self, chat: ChatFn, traj: Trajectory, params: dict[str, Any], episode: Episode,
                 system_prompt: str, task_prompt: str, tools: tuple[ToolSpec, ...]) -> None:
        self._chat = chat
        self.traj = traj
        self.params = params
        self.episode = episode
        self.system_prompt = system_prompt
        self.task_prompt = task_prompt
        self.tools = tools
        self.turn = 0

    def chat(self, messages: list[dict[str, Any]], **params: Any) -> Reply:
        merged = {**self.params, **params}
        result = self._chat(messages, merged)
        if "error" in result:
            raise ModelFailure(result["error"])
        calls = result.get("tool_calls") or []
        usage = result.get("usage", {})
        self.traj.model_calls += 1
        self.traj.cache_hits += int(bool(result.get("cache_hit")))
        self.traj.model_time_s += float(result.get("latency_s", 0.0))
        self.traj.prompt_tokens += int(usage.get("prompt_tokens", 0))
        self.traj.completion_tokens += int(usage.get("completion_tokens", 0))
        self.traj.add("model", self.turn, messages=messages, reply=result["text"], tool_calls=calls,
                      finish_reason=result.get("finish_reason", ""), usage=usage,
                      latency_s=result.get("latency_s", 0.0), cache_hit=bool(result.get("cache_hit")),
                      retries=int(result.get("retries", 0)), **_call_of(result))
        return as_reply({"text": result["text"], "tool_calls": calls})

    def step(self, action: Action) -> str:
        """Validate the call against its schema, then run it; a violation is the call's (recorded) result."""
        self.traj.add("action", self.turn, tool=action.tool, input=action.input, arguments=action.arguments)
        # an environment whose gold calls its own schemas reject may switch validation off
        problem = validate(action, self.tools) if getattr(self.episode, "validate_arguments", True) else None
        if problem is not None:
            kind, observation = problem
            self.traj.add("tool_error", self.turn, tool=action.tool, error=kind, text=observation)
        else:
            observation = self.episode.step(action)
            if observation.startswith("Error"):
                self.traj.add("tool_error", self.turn, tool=action.tool, error="tool_error", text=observation[:300])
        self.traj.add("observation", self.turn, text=observation)
        return observation

    def note(self, kind: str, **data: Any) -> None:
        self.traj.add(kind, self.turn, **data)


def _call_of(result: dict[str, Any]) -> dict[str, Any]:
    """The id of the host call a reply answered ({"call": id}), when it came over the sandbox channel."""
    return {"call": result["call"]} if "call" in result else {}


def _text_realize(reply: Reply, ctx: ActionContext) -> Action | Reject:
    return Action("answer", reply.strip())


def _default_regulate(state: StepState) -> Verdict:
    return Verdict()


def load_realize(harness: HarnessVersion, harness_dir: Path) -> RealizeFn:
    if harness.manifest.files.action:
        path = harness_dir / harness.manifest.files.action
        return layer_function(load_module(path, "harness_action"), "realize", path)
    return native_realize if harness.manifest.tool_calling == "native" else _text_realize


def _assistant_message(reply: Reply, actions: list[Action], native: bool) -> dict[str, Any]:
    """The assistant turn as kept in the history: in native mode, the realized calls (canonical)."""
    calls = [a for a in actions if not (a.is_answer or a.is_respond)]
    if not native or not calls:
        return {"role": "assistant", "content": reply.text}
    return {"role": "assistant", "content": reply.text,
            "tool_calls": [{"id": a.call_id or f"call_{i}", "name": a.tool,
                            "arguments": json.dumps(a.arguments) if a.arguments is not None else a.input}
                           for i, a in enumerate(calls)]}


def _conversation(messages: list[dict[str, Any]]) -> list[dict[str, str]]:
    """What the simulated user sees: the text turns only (no system prompt, tools or tool results)."""
    return [{"role": m["role"], "content": m["content"]} for m in messages
            if m["role"] in ("user", "assistant") and m.get("content") and not m.get("tool_calls")]


def run_episode(harness: HarnessVersion, harness_dir: Path, task: dict[str, Any], episode: Episode,
                chat: ChatFn, traj: Trajectory, trial: int = 0, user: UserFn | None = None) -> None:
    """Fill `traj` by running one episode. Raises on harness errors (the caller records them).

    With `user` (a simulated user served by the host) the episode is a conversation: text without a
    tool call goes to the user, and the episode ends when the user ends it or a budget runs out.
    """
    m = harness.manifest
    gen = m.generation
    native = m.tool_calling == "native"
    conversational = user is not None and bool(task.get("conversational"))
    params: dict[str, Any] = {"temperature": gen.temperature, "max_tokens": gen.max_tokens, "top_p": gen.top_p,
                              "stop": gen.stop, "sample_index": trial}
    # a harness's tool list filters the environment's shared tools; tools a task brings are always offered
    task_tools = bool(getattr(episode, "task_tools", False))
    tools = tuple(t for t in episode.tools if m.tools is None or task_tools or t.name in m.tools)
    if native and tools:
        params["tools"] = openai_tools(tools)
    system_prompt, tips, skill_ids = build_system_prompt(harness, tools, task["prompt"], conversational)
    if m.mode == "freeform" and tips:  # a free-form loop builds its own messages from the system prompt
        system_prompt, tips = f"{system_prompt}\n\n{tips}", ""
    session = AgentSession(chat, traj, params, episode, system_prompt, task["prompt"], tools)
    traj.add("prompt", 0, system=system_prompt, skills=skill_ids, tips=tips,
             tools=[t.to_record() for t in tools])
    if m.mode == "freeform":
        path = harness_dir / str(m.files.loop)
        answer = layer_function(load_module(path, "harness_loop"), "run", path)(session)
        traj.final_answer = None if answer is None else str(answer)
        traj.termination = "answered" if answer is not None else "stopped"
        return
    realize = load_realize(harness, harness_dir)
    repairs = parse_repairs(harness.files.get(REPAIRS_FILE))
    regulate = _default_regulate
    if m.files.regulate:
        path = harness_dir / m.files.regulate
        regulate = layer_function(load_module(path, "harness_regulate"), "regulate", path)
    messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages += parse_demos(harness.layer_text("demos"))
    messages += example_messages(harness.layer_text("examples"), task["prompt"])  # retrieved for this task
    start = len(messages)
    choices = tuple(str(c) for c in (task.get("public") or {}).get("choices") or ())
    if conversational:
        messages.append({"role": "assistant", "content": getattr(episode, "greeting", "") or GREETING})
        if not _user_turn(user, messages[start:], messages, traj, 0):
            return
    else:
        messages.append({"role": "user", "content": f"{tips}\n\n{task['prompt']}" if tips else task["prompt"]})
    history: list[tuple[Action, str]] = []
    rejections = 0
    try:
        for turn in range(m.budget.max_turns):
            session.turn = turn
            ctx = ActionContext(tools, turn, task["prompt"], conversational, choices,
                                history[-1][1] if history else "")
            reply = session.chat(list(messages))
            realized = realize_message(realize, repairs, reply, ctx)
            if gen.samples > 1 and realized.reject is None and any(a.is_answer for a in realized.actions):
                reply, realized = vote(session, messages, reply, realized, gen.samples, gen.sample_temperature,
                                       lambda r, ctx=ctx: realize_message(realize, repairs, r, ctx))
            for name in realized.repairs:
                traj.add("repair", turn, name=name)
            if realized.reject is not None:
                rejections += 1
                messages.append({"role": "assistant", "content": reply.text})
                traj.add("rejection", turn, feedback=realized.reject.feedback, rule=realized.reject.rule)
                if rejections > m.budget.max_rejections:
                    traj.termination = "rejected"
                    return
                messages.append({"role": "user", "content": realized.reject.feedback})
                continue
            rejections = 0
            messages.append(_assistant_message(reply, realized.actions, native))
            tool_calls = messages[-1].get("tool_calls", [])
            for index, action in enumerate(realized.actions):
                if action.is_answer:
                    traj.add("action", turn, tool="answer", input=action.input)
                    traj.final_answer = action.input
                    traj.termination = "answered"
                    return
                if action.is_respond:
                    traj.add("action", turn, tool="respond", input=action.input)
                    if not native:
                        messages[-1]["content"] = action.input
                    if not _user_turn(user, messages[start:], messages, traj, turn):
                        return
                    continue
                observation = session.step(action)
                verdict = regulate(StepState(turn, m.budget.max_turns, action, observation, list(history)))
                history.append((action, observation))
                if verdict.annotation:
                    traj.add("annotation", turn, text=verdict.annotation)
                    observation = f"{observation}\n{verdict.annotation}"
                if native and index < len(tool_calls):
                    messages.append({"role": "tool", "tool_call_id": tool_calls[index]["id"], "content": observation})
                else:
                    messages.append({"role": "user", "content": observation})
                if verdict.stop:
                    traj.add("stop", turn, reason=verdict.reason)
                    traj.termination = "stopped"
                    return
            if getattr(episode, "done", False):  # the environment says the task is complete
                traj.termination = "done"
                return
        traj.termination = "max_turns"
    finally:
        traj.conversation = messages[start:]


def _user_turn(user: UserFn | None, episode_messages: list[dict[str, Any]], messages: list[dict[str, Any]],
               traj: Trajectory, turn: int) -> bool:
    """Ask the simulated user for its next message (it sees the episode's text turns, not the system prompt
    or demonstrations); False if the conversation is over."""
    if user is None:
        traj.termination = "answered"
        return False
    conversation = _conversation(episode_messages)
    result = user(conversation)
    if "error" in result:
        raise ModelFailure(f"user simulator: {result['error']}")
    traj.add("user", turn, text=result["text"], stop=bool(result.get("stop")), reason=result.get("reason", ""),
             seen=digest(conversation), **_call_of(result))
    if result.get("stop"):
        traj.termination = "max_turns" if result.get("limit") else "user_stop"
        if result["text"]:
            messages.append({"role": "user", "content": result["text"]})
        return False
    messages.append({"role": "user", "content": result["text"]})
    return True
