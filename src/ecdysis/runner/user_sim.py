"""The simulated user of conversation tasks: an LLM given the task's hidden scenario, run in the host.

The sandbox sends the conversation's text turns; the host answers with the user's next message.
The scenario never enters the sandbox or an optimizer prompt. Calls are made under the `user`
role, so they are cached, accounted and budgeted apart from the agent's.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from string import Template
from typing import Any

from ..models.base import ChatRequest, GenerationParams, Message, ModelError
from ..models.cache import MeteredModel

STOP_TOKENS = ("###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###")


def user_system_prompt(scenario: str) -> str:
    text = (resources.files("ecdysis.prompts") / "user_simulator.md").read_text()
    return Template(text).safe_substitute(scenario=scenario.strip())


@dataclass
class UserSimulator:
    """One conversation's user. `max_turns` bounds the user's messages; then the user ends the talk."""

    model: MeteredModel
    scenario: str
    max_turns: int = 10
    temperature: float = 0.0
    max_tokens: int = 200
    session: str = ""  # the conversation, so a local backend keeps the user's KV cache per episode
    partition: str = ""  # the evaluation's cache partition (its split)
    turns: int = 0

    def request(self, conversation: list[dict[str, str]]) -> ChatRequest:
        """Roles flip: the agent's messages are the simulator's input, its own messages its output."""
        flipped = [Message(role="user" if m["role"] == "assistant" else "assistant", content=m["content"])
                   for m in conversation]
        if not flipped or flipped[-1].role != "user":
            flipped.append(Message(role="user", content="(the agent is waiting for your reply)"))
        return ChatRequest(messages=[Message(role="system", content=user_system_prompt(self.scenario)), *flipped],
                           params=GenerationParams(temperature=self.temperature, max_tokens=self.max_tokens,
                                                   session=self.session))

    async def reply(self, conversation: list[dict[str, str]]) -> dict[str, Any]:
        """{"text", "stop", "usage", "latency_s", "cache_hit"} or {"error"}."""
        if self.turns >= self.max_turns:
            return {"text": "", "stop": True, "limit": True, "reason": f"user turn limit ({self.max_turns}) reached"}
        self.turns += 1
        try:
            response = await self.model.chat(self.request(conversation), partition=self.partition)
        except (ModelError, ValueError) as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}
        text = response.text.strip()
        stop = any(token in text for token in STOP_TOKENS) or not text
        for token in STOP_TOKENS:
            text = text.replace(token, "").strip()
        return {"text": text, "stop": stop, "usage": response.usage.model_dump(),
                "latency_s": response.latency_s, "cache_hit": response.cache_hit, "charged_s": response.charged_s,
                "request_key": response.request_key}
