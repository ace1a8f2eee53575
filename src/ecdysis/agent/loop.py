"""The library's agent loop: drives the harness layers over one episode and records everything.

It is synchronous and runs inside the sandbox worker; `chat` is the only way out to a model (the
worker forwards it to the host). Exceptions from harness code propagate to the caller, which
records them as a crashed trajectory.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from ..envs.base import Episode
from ..harness.api import Action, ActionContext, Reject, StepState, ToolSpec, Verdict
from ..harness.manifest import HarnessVersion
from ..harness.repairs import REPAIRS_FILE, Repair, parse_repairs, try_repairs
from ..harness.skills import parse_demos, parse_skills, retrieve
from .trajectory import Trajectory

ChatFn = Callable[[list[dict[str, str]], dict[str, Any]], dict[str, Any]]


class ModelFailure(RuntimeError):
    """The model backend failed for good; the episode ends as `model_error`."""


def load_module(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def render_tools(tools: tuple[ToolSpec, ...]) -> str:
    return "\n".join(f"- {t.name}: {t.description}" for t in tools) or "(no tools: answer directly)"


def build_system_prompt(harness: HarnessVersion, tools: tuple[ToolSpec, ...],
                        task_prompt: str) -> tuple[str, list[str]]:
    """H3 contract with tools filled in, plus H5 tips retrieved for this task. Returns (text, skill ids)."""
    contract = (harness.layer_text("contract") or "").replace("{tools}", render_tools(tools))
    skills = retrieve(parse_skills(harness.layer_text("skills")), task_prompt, harness.manifest.budget.top_k_skills)
    if skills:
        contract += "\n\nTips:\n" + "\n".join(f"- {s.tip}" for s in skills)
    return contract.strip(), [s.id for s in skills]


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

    def chat(self, messages: list[dict[str, str]], **params: Any) -> str:
        merged = {**self.params, **params}
        result = self._chat(messages, merged)
        if "error" in result:
            raise ModelFailure(result["error"])
        usage = result.get("usage", {})
        self.traj.model_calls += 1
        self.traj.cache_hits += int(bool(result.get("cache_hit")))
        self.traj.model_time_s += float(result.get("latency_s", 0.0))
        self.traj.prompt_tokens += int(usage.get("prompt_tokens", 0))
        self.traj.completion_tokens += int(usage.get("completion_tokens", 0))
        self.traj.add("model", self.turn, messages=messages, reply=result["text"],
                      finish_reason=result.get("finish_reason", ""), usage=usage,
                      latency_s=result.get("latency_s", 0.0), cache_hit=bool(result.get("cache_hit")))
        return result["text"]

    def step(self, action: Action) -> str:
        self.traj.add("action", self.turn, tool=action.tool, input=action.input)
        observation = self.episode.step(action)
        self.traj.add("observation", self.turn, text=observation)
        return observation

    def note(self, kind: str, **data: Any) -> None:
        self.traj.add(kind, self.turn, **data)


def _default_realize(reply: str, ctx: ActionContext) -> Action | Reject:
    return Action("answer", reply.strip())


def _default_regulate(state: StepState) -> Verdict:
    return Verdict()


def realize_reply(realize: Callable[[str, ActionContext], Action | Reject], repairs: list[Repair],
                  reply: str, ctx: ActionContext) -> tuple[Action | Reject, str | None]:
    """H2 on one reply: the harness's realize, then enabled repairs if it rejected. (result, repair)"""
    result = realize(reply, ctx)
    if isinstance(result, Reject) and repairs:
        repaired = try_repairs(repairs, reply, ctx.tools)
        if repaired is not None:
            return repaired
    return result, None


def load_realize(harness: HarnessVersion, harness_dir: Path) -> Callable[[str, ActionContext], Action | Reject]:
    if harness.manifest.files.action:
        return load_module(harness_dir / harness.manifest.files.action, "harness_action").realize
    return _default_realize


def run_episode(harness: HarnessVersion, harness_dir: Path, task: dict[str, Any], episode: Episode,
                chat: ChatFn, traj: Trajectory, trial: int = 0) -> None:
    """Fill `traj` by running one episode. Raises on harness errors (the caller records them)."""
    m = harness.manifest
    gen = m.generation
    params = {"temperature": gen.temperature, "max_tokens": gen.max_tokens, "top_p": gen.top_p,
              "stop": gen.stop, "sample_index": trial}
    tools = tuple(t for t in episode.tools if m.tools is None or t.name in m.tools)
    system_prompt, skill_ids = build_system_prompt(harness, tools, task["prompt"])
    session = AgentSession(chat, traj, params, episode, system_prompt, task["prompt"], tools)
    traj.add("prompt", 0, system=system_prompt, skills=skill_ids)
    if m.mode == "freeform":
        loop = load_module(harness_dir / str(m.files.loop), "harness_loop")
        answer = loop.run(session)
        traj.final_answer = None if answer is None else str(answer)
        traj.termination = "answered" if answer is not None else "stopped"
        return
    realize = load_realize(harness, harness_dir)
    repairs = parse_repairs(harness.files.get(REPAIRS_FILE))
    regulate = _default_regulate
    if m.files.regulate:
        regulate = load_module(harness_dir / m.files.regulate, "harness_regulate").regulate
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages += parse_demos(harness.layer_text("demos"))
    messages.append({"role": "user", "content": task["prompt"]})
    history: list[tuple[Action, str]] = []
    rejections = 0
    for turn in range(m.budget.max_turns):
        session.turn = turn
        reply = session.chat(list(messages))
        messages.append({"role": "assistant", "content": reply})
        result, repaired_by = realize_reply(realize, repairs, reply, ActionContext(tools, turn, task["prompt"]))
        if repaired_by:
            traj.add("repair", turn, name=repaired_by)
        if isinstance(result, Reject):
            rejections += 1
            traj.add("rejection", turn, feedback=result.feedback, rule=result.rule)
            if rejections > m.budget.max_rejections:
                traj.termination = "rejected"
                return
            messages.append({"role": "user", "content": result.feedback})
            continue
        if not isinstance(result, Action):
            raise TypeError(f"realize() must return Action or Reject, got {type(result).__name__}")
        rejections = 0
        if result.is_answer:
            traj.add("action", turn, tool="answer", input=result.input)
            traj.final_answer = result.input
            traj.termination = "answered"
            return
        observation = session.step(result)
        verdict = regulate(StepState(turn, m.budget.max_turns, result, observation, list(history)))
        history.append((result, observation))
        if verdict.annotation:
            traj.add("annotation", turn, text=verdict.annotation)
            observation = f"{observation}\n{verdict.annotation}"
        if verdict.stop:
            traj.add("stop", turn, reason=verdict.reason)
            traj.termination = "stopped"
            return
        messages.append({"role": "user", "content": observation})
    traj.termination = "max_turns"
