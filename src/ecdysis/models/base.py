"""The one chat interface every model backend implements.

A backend turns a `ChatRequest` into a `ChatResponse`. Everything above this layer (agent loop,
optimizer roles, cache, accounting) only knows these types.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, Field

Role = Literal["system", "user", "assistant", "tool"]


class ModelToolCall(BaseModel):
    """A function call the model asked for. `arguments` is the raw JSON text, as the API gives it."""

    id: str = ""
    name: str
    arguments: str = "{}"


class Message(BaseModel):
    """A chat message. Assistant messages may carry `tool_calls`; `tool` messages answer one by id."""

    role: Role
    content: str = ""
    tool_calls: list[ModelToolCall] | None = None
    tool_call_id: str | None = None

    def to_openai(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.name, "arguments": c.arguments}} for c in self.tool_calls]
        if self.role == "tool":
            out["tool_call_id"] = self.tool_call_id or ""
        return out


class GenerationParams(BaseModel):
    """Sampling parameters. `sample_index` distinguishes deliberate resamples in the cache."""

    temperature: float = 0.0
    max_tokens: int = 512
    top_p: float = 1.0
    stop: list[str] = Field(default_factory=list)
    seed: int | None = None
    json_schema: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None  # OpenAI function-tool definitions (part of the cache key)
    tool_choice: str | dict[str, Any] | None = None  # "auto" | "required" | "none" | {"type": "function", ...}
    sample_index: int = 0
    session: str = ""  # which conversation this call continues (KV reuse on local backends); not in the cache key

    @property
    def call_seed(self) -> int:
        """The seed a backend samples this call with: from the request alone (`seed` + `sample_index`), so a
        sampled reply does not depend on the calls made before it (llama-cpp-python would chain an unseeded
        call's seed from the previous call's)."""
        return (self.seed or 0) + self.sample_index


class ChatRequest(BaseModel):
    messages: list[Message]
    params: GenerationParams = Field(default_factory=GenerationParams)

    def canonical_json(self) -> str:
        data = self.model_dump(mode="json", exclude_none=True)
        data["params"].pop("session", None)
        return json.dumps(data, sort_keys=True, separators=(",", ":"))


class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    constrained_tokens: int = 0  # of completion_tokens, generated under a grammar (JSON schema, forced call)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class ChatResponse(BaseModel):
    text: str
    tool_calls: list[ModelToolCall] = Field(default_factory=list)
    finish_reason: str = "stop"
    usage: Usage = Field(default_factory=Usage)
    latency_s: float = 0.0
    cost_usd: float = 0.0
    model_id: str = ""
    cache_hit: bool = False
    retries: int = 0  # attempts beyond the first that this reply took (429s, 5xx, timeouts, malformed bodies)
    charged_s: float = 0.0  # what the call costs by the rate table (charge.py), served fresh or from the cache
    request_key: str = ""  # model + request, no cache scope ("": no cache, every call is paid); set by MeteredModel


_SECRETS = re.compile(r"(sk-[A-Za-z0-9_\-]{8,}|(?<=Bearer )[A-Za-z0-9._\-]{8,}"
                      r"|(?i:api[_-]?key)[\"'=: ]+[A-Za-z0-9._\-]{8,})")


def redact(text: str, secrets: tuple[str, ...] = ()) -> str:
    """`text` with API keys masked: the given secret values and anything shaped like a key or bearer token."""
    for secret in secrets:
        if secret and len(secret) >= 6:
            text = text.replace(secret, "[redacted]")
    return _SECRETS.sub("[redacted]", text)


class ModelError(RuntimeError):
    """A model call failed for good (after any retries). The message says what to do; keys are redacted."""

    def __init__(self, message: str, secrets: tuple[str, ...] = ()) -> None:
        super().__init__(redact(message, secrets))


class ModelConfigError(ValueError):
    """A model reference or its settings are wrong (unknown form, missing key, missing file)."""


@runtime_checkable
class ChatModel(Protocol):
    """Async chat model. `identity` is stable across processes and names the exact weights/endpoint."""

    @property
    def identity(self) -> str: ...

    async def chat(self, request: ChatRequest) -> ChatResponse: ...


def cache_key(identity: str, request: ChatRequest) -> str:
    """Canonical hash of model identity, messages, parameters and sample index."""
    h = hashlib.sha256()
    h.update(identity.encode())
    h.update(b"\0")
    h.update(request.canonical_json().encode())
    return h.hexdigest()


def user(content: str) -> Message:
    return Message(role="user", content=content)


def system(content: str) -> Message:
    return Message(role="system", content=content)


def assistant(content: str) -> Message:
    return Message(role="assistant", content=content)
