"""The types harness code uses. Import-light: this module runs inside the sandbox.

H2 `action.py` defines   realize(reply: str, ctx: ActionContext) -> Action | Reject
H4 `regulate.py` defines regulate(state: StepState) -> Verdict
Free-form `loop.py` defines run(agent: AgentIO) -> str | None  (the final answer)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str


@dataclass(frozen=True)
class Action:
    """A realized action: call a tool with `input`, or give the final `answer` (tool == "answer")."""

    tool: str
    input: str = ""

    @property
    def is_answer(self) -> bool:
        return self.tool == "answer"


def answer(text: str) -> Action:
    return Action(tool="answer", input=text)


@dataclass(frozen=True)
class Reject:
    """The reply could not be turned into a valid action; `feedback` is shown to the model."""

    feedback: str
    rule: str = "unparsed"


@dataclass(frozen=True)
class ActionContext:
    tools: tuple[ToolSpec, ...]
    turn: int
    task_prompt: str


@dataclass
class StepState:
    """What H4 sees after an environment step."""

    turn: int
    max_turns: int
    action: Action
    observation: str
    history: list[tuple[Action, str]] = field(default_factory=list)  # earlier (action, observation)


@dataclass(frozen=True)
class Verdict:
    """H4's decision: text appended to the observation, and whether (and why) to stop."""

    annotation: str = ""
    stop: bool = False
    reason: str = ""


class AgentIO(Protocol):
    """What a free-form loop may use: the model, the tools, and the harness's own layers."""

    system_prompt: str
    task_prompt: str
    tools: tuple[ToolSpec, ...]

    def chat(self, messages: list[dict[str, str]], **params: Any) -> str: ...

    def step(self, action: Action) -> str: ...

    def note(self, kind: str, **data: Any) -> None: ...
