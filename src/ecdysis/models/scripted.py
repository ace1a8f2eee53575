"""Scripted model for tests: replies come from a list (in order, cycling) or a callable."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from .base import ChatRequest, ChatResponse, Message, Usage
from .toolcalls import split_tool_calls, tool_names_of

Responder = Callable[[list[Message]], str]


class ScriptedModel:
    """Deterministic stand-in for a real model. Counts calls; optional artificial delay."""

    def __init__(
        self,
        responses: Sequence[str] | Responder,
        name: str = "scripted",
        delay_s: float = 0.0,
    ) -> None:
        self._responses = responses
        self._name = name
        self._delay_s = delay_s
        self.calls: list[ChatRequest] = []

    @property
    def identity(self) -> str:
        return f"scripted:{self._name}"

    async def chat(self, request: ChatRequest) -> ChatResponse:
        start = time.perf_counter()
        index = len(self.calls)
        self.calls.append(request)
        if self._delay_s:
            await asyncio.sleep(self._delay_s)
        if callable(self._responses):
            text = self._responses(list(request.messages))
        else:
            if not self._responses:
                raise ValueError("ScriptedModel has no responses")
            text = self._responses[index % len(self._responses)]
        prompt_tokens = sum(len(m.content.split()) for m in request.messages)
        calls = []
        if request.params.tools:  # scripts write calls as a template would: <tool_call>{...}</tool_call>
            text, calls = split_tool_calls(text, tool_names_of(request.params.tools))
        return ChatResponse(
            text=text,
            tool_calls=calls,
            finish_reason="stop",
            usage=Usage(prompt_tokens=prompt_tokens, completion_tokens=len(text.split())),
            latency_s=time.perf_counter() - start,
            model_id=self.identity,
        )
