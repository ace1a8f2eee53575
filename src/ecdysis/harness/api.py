"""The types harness code uses. Import-light: this module runs inside the sandbox.

H2 `action.py` defines   realize(reply: Reply, ctx: ActionContext) -> Action | list[Action] | Reject
H4 `regulate.py` defines regulate(state: StepState) -> Verdict
Free-form `loop.py` defines run(agent: AgentIO) -> str | None  (the final answer)

A `Reply` is the assistant message: it *is* its text (a `str`), and `reply.tool_calls` holds the
function calls the model made through the native tool-calling API (empty for text protocols).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolSpec:
    """A tool: name, description and the JSON schema of its arguments (an object schema).

    Text-protocol tools (DBBench's SQL block) take one free-text `input` and leave `parameters` None.
    """

    name: str
    description: str
    parameters: dict[str, Any] | None = None

    def to_openai(self) -> dict[str, Any]:
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters or EMPTY_PARAMETERS}}

    def to_record(self) -> dict[str, Any]:
        """As stored in a trajectory's `prompt` event."""
        return {"name": self.name, "description": self.description, "parameters": self.parameters}

    @classmethod
    def from_record(cls, record: dict[str, Any] | str) -> ToolSpec:
        """From a stored record, or from a bare name (trajectories recorded before tools were stored)."""
        if isinstance(record, str):
            return cls(record, "")
        return cls(record["name"], record.get("description", ""), record.get("parameters"))


@dataclass(frozen=True)
class ToolCall:
    """One call as the model made it; `arguments` is raw JSON text (it may be malformed)."""

    id: str
    name: str
    arguments: str = "{}"


class Reply(str):
    """The assistant's message: its text, plus the native tool calls it made."""

    tool_calls: tuple[ToolCall, ...]

    def __new__(cls, text: str, tool_calls: tuple[ToolCall, ...] = ()) -> Reply:
        obj = super().__new__(cls, text)
        obj.tool_calls = tuple(tool_calls)
        return obj

    @property
    def text(self) -> str:
        return str(self)


ANSWER, RESPOND = "answer", "respond"


@dataclass(frozen=True)
class Action:
    """A realized action.

    `tool == "answer"`: the final answer (`input`). `tool == "respond"`: a message to the user in a
    conversation (`input`). Otherwise a tool call: free text `input` for text-protocol tools, or
    structured `arguments` for schema tools; `call_id` ties the result to a native call.
    """

    tool: str
    input: str = ""
    arguments: dict[str, Any] | None = None
    call_id: str = ""

    @property
    def is_answer(self) -> bool:
        return self.tool == ANSWER

    @property
    def is_respond(self) -> bool:
        return self.tool == RESPOND

    def key(self) -> str:
        """Identity for loop detection: tool and arguments (or input), not the call id."""
        return action_key(self.tool, self.arguments, self.input)


def action_key(tool: str, arguments: dict[str, Any] | None, input: str = "") -> str:
    """The identity of a call (also of a recorded `action` event): tool plus sorted arguments, or input."""
    import json

    body = json.dumps(arguments, sort_keys=True) if arguments is not None else input
    return f"{tool}:{body}"


def answer(text: str) -> Action:
    return Action(tool=ANSWER, input=text)


def respond(text: str) -> Action:
    return Action(tool=RESPOND, input=text)


def call(name: str, arguments: dict[str, Any], call_id: str = "") -> Action:
    return Action(tool=name, arguments=arguments, call_id=call_id)


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
    conversational: bool = False  # a user is on the other side: text without a call goes to the user
    choices: tuple[str, ...] = ()  # the task's finite answer set, when its environment declares one
    last_observation: str = ""  # what the environment returned for the previous action ("" before any)


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

    def chat(self, messages: list[dict[str, Any]], **params: Any) -> Reply: ...

    def step(self, action: Action) -> str: ...

    def note(self, kind: str, **data: Any) -> None: ...
