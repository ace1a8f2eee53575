"""The OpenAI Chat Completions wire format, as far as the proxy speaks it (pydantic records).

Requests are parsed leniently (unknown fields are kept and ignored) so that SDKs and agent
frameworks work unmodified; content given as a list of parts is reduced to its text parts. Replies
are built as the SDK expects them: one `chat.completion` object, or `chat.completion.chunk` events
for `stream=true`.
"""

from __future__ import annotations

import json
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..harness.api import ToolSpec
from ..models.base import Message, ModelToolCall


class WireError(ValueError):
    """The request is not something the proxy can serve; the message says why (HTTP 400)."""


class WireFunction(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    description: str = ""
    parameters: dict[str, Any] | None = None


class WireTool(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["function"] = "function"
    function: WireFunction


class ChatCompletionRequest(BaseModel):
    """`POST /v1/chat/completions`. Sampling fields left out fall back to the harness's generation settings."""

    model_config = ConfigDict(extra="allow")
    model: str = ""
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[WireTool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    user: str | None = None
    n: int | None = None
    response_format: dict[str, Any] | None = None

    def check(self) -> None:
        """Refuse what the proxy cannot serve faithfully (WireError, HTTP 400)."""
        if self.n not in (None, 1):
            raise WireError("n > 1 is not supported: the harness realizes one reply per request")

    def json_schema(self) -> dict[str, Any] | None:
        """`response_format` as a JSON schema for the upstream (json_schema or json_object), else None."""
        fmt = self.response_format or {}
        if fmt.get("type") == "json_schema":
            return (fmt.get("json_schema") or {}).get("schema") or {"type": "object"}
        if fmt.get("type") == "json_object":
            return fmt.get("schema") or {"type": "object"}
        return None

    def tool_specs(self) -> tuple[ToolSpec, ...]:
        """The request's function tools as harness `ToolSpec`s (schema-less tools take no arguments)."""
        return tuple(ToolSpec(t.function.name, t.function.description or "",
                              t.function.parameters or {"type": "object", "properties": {}})
                     for t in self.tools or [])

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


def content_text(content: Any) -> str:
    """Message content as text: a string, or the text parts of a list of parts. Other parts are refused."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") in ("text", "input_text"):
                texts.append(str(part.get("text", "")))
            elif isinstance(part, str):
                texts.append(part)
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise WireError(f"message content part of type {kind!r} is not supported (text only)")
        return "".join(texts)
    raise WireError(f"message content must be a string or a list of parts, not {type(content).__name__}")


def to_messages(raw: list[dict[str, Any]]) -> list[Message]:
    """Wire messages as model-layer messages. `developer` counts as `system`; `function` is refused."""
    out: list[Message] = []
    for index, m in enumerate(raw):
        role = m.get("role")
        if role == "developer":
            role = "system"
        if role not in ("system", "user", "assistant", "tool"):
            raise WireError(f"messages[{index}]: role {role!r} is not supported "
                            "(system, developer, user, assistant, tool)")
        calls = None
        if role == "assistant" and m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                fn = c.get("function") or {}
                args = fn.get("arguments", "{}")
                calls.append(ModelToolCall(id=str(c.get("id", "")), name=str(fn.get("name", "")),
                                      arguments=args if isinstance(args, str) else json.dumps(args)))
        out.append(Message(role=role, content=content_text(m.get("content")), tool_calls=calls,
                           tool_call_id=str(m["tool_call_id"]) if role == "tool" and m.get("tool_call_id") else None))
    return out


class OutgoingCall(BaseModel):
    """A tool call in the reply the agent receives; `arguments` is JSON text."""

    id: str
    name: str
    arguments: str


class FinalReply(BaseModel):
    """The one clean reply the agent sees."""

    content: str
    tool_calls: list[OutgoingCall] = Field(default_factory=list)
    finish_reason: str = "stop"
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def message(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": "assistant", "content": self.content or (None if self.tool_calls else "")}
        if self.tool_calls:
            out["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.name, "arguments": c.arguments}} for c in self.tool_calls]
        return out

    def usage(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}


def completion_body(reply: FinalReply, completion_id: str, model: str) -> dict[str, Any]:
    """A `chat.completion` object."""
    return {"id": completion_id, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": reply.message(), "finish_reason": reply.finish_reason,
                         "logprobs": None}],
            "usage": reply.usage()}


def completion_chunks(reply: FinalReply, completion_id: str, model: str, include_usage: bool) -> list[dict[str, Any]]:
    """The reply as `chat.completion.chunk` objects: role, content, one chunk per tool call, finish (and usage)."""
    created = int(time.time())

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"id": completion_id, "object": "chat.completion.chunk", "created": created,
                                "model": model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish,
                                                             "logprobs": None}]}
        if include_usage:
            body["usage"] = None
        return body

    chunks = [chunk({"role": "assistant", "content": ""})]
    if reply.content:
        chunks.append(chunk({"content": reply.content}))
    for index, call in enumerate(reply.tool_calls):
        chunks.append(chunk({"tool_calls": [{"index": index, "id": call.id, "type": "function",
                                             "function": {"name": call.name, "arguments": call.arguments}}]}))
    chunks.append(chunk({}, reply.finish_reason))
    if include_usage:
        chunks.append({"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": model,
                       "choices": [], "usage": reply.usage()})
    return chunks


def error_body(message: str, kind: str, code: str | None = None) -> dict[str, Any]:
    """The OpenAI error shape, which SDKs turn into exceptions carrying `message`."""
    return {"error": {"message": message, "type": kind, "param": None, "code": code or kind}}
