"""Scripted model for tests: replies come from a list (in order, cycling) or a callable.

A reply is text (calls written as `<tool_call>{...}</tool_call>` blocks, as a chat template would) or
{"text": ..., "tool_calls": [{"name": ..., "arguments": {...}}]}. `scripted:@replies.json` (a JSON list of such
replies) plays the list in order from the command line, each episode from its start, repeating the last reply.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .base import ChatRequest, ChatResponse, Message, ModelConfigError, ModelToolCall, Usage
from .toolcalls import call_id, split_tool_calls, tool_names_of, under_grammar

Responder = Callable[[list[Message]], str | dict[str, Any]]


class EpisodeScript:
    """Plays `replies` in order within each episode (calls of one `session`: the n-th call gets reply n; past
    the end, the last), so a multi-turn episode can be scripted turn by turn."""

    def __init__(self, replies: Sequence[str | dict[str, Any]]) -> None:
        self.replies = list(replies)
        self.turns: dict[str, int] = {}

    def next(self, session: str) -> str | dict[str, Any]:
        turn = self.turns.get(session, 0)
        self.turns[session] = turn + 1
        return self.replies[min(turn, len(self.replies) - 1)]


def from_file(path: str | Path) -> ScriptedModel:
    """`scripted:@FILE`: a JSON list of replies played in order in each episode."""
    try:
        replies = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ModelConfigError(f"scripted:@{path}: cannot read the reply file {path} ({exc.strerror}); write a JSON "
                               'list of replies there, e.g. ["Answer: 4"]') from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelConfigError(f"scripted:@{path}: the reply file is not JSON ({exc}); write a JSON list of replies, "
                               'e.g. ["Answer: 4"]') from None
    if not isinstance(replies, list) or not replies:
        raise ModelConfigError(f"scripted:@{path}: the reply file must hold a non-empty JSON list of replies")
    return ScriptedModel(EpisodeScript(replies), name=Path(path).name)


class ScriptedModel:
    """Deterministic stand-in for a real model. Counts calls; optional artificial delay."""

    def __init__(
        self,
        responses: Sequence[str | dict[str, Any]] | Responder | EpisodeScript,
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
        if isinstance(self._responses, EpisodeScript):
            reply = self._responses.next(request.params.session)
        elif callable(self._responses):
            reply = self._responses(list(request.messages))
        else:
            if not self._responses:
                raise ValueError("ScriptedModel has no responses")
            reply = self._responses[index % len(self._responses)]
        prompt_tokens = sum(len(m.content.split()) for m in request.messages)
        calls: list[ModelToolCall] = []
        if isinstance(reply, dict):
            text = str(reply.get("text", ""))
            for i, c in enumerate(reply.get("tool_calls") or []):
                args = c.get("arguments", {})
                raw = args if isinstance(args, str) else json.dumps(args)
                calls.append(ModelToolCall(id=call_id(i, c["name"], raw), name=c["name"], arguments=raw))
        else:
            text = reply
        if request.params.tools and not calls:  # scripts write calls as a template would: <tool_call>{...}
            text, calls = split_tool_calls(text, tool_names_of(request.params.tools))
        return ChatResponse(
            text=text,
            tool_calls=calls,
            finish_reason="stop",
            usage=Usage(prompt_tokens=prompt_tokens, completion_tokens=len(text.split()),  # a grammar as a backend
                        constrained_tokens=len(text.split()) if under_grammar(request.params) else 0),
            latency_s=time.perf_counter() - start,
            model_id=self.identity,
        )
