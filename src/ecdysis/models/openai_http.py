"""OpenAI-compatible HTTP backend (OpenAI, vLLM, SGLang, Ollama, llama.cpp server, routers).

Retries with exponential backoff and jitter on 429, 5xx, timeouts, connection errors and malformed
responses (a body that is not a chat completion) (tenacity); never on other 4xx. The retries a reply
took are part of the response, so trajectories record what the endpoint put the run through. A
semaphore per endpoint bounds concurrency; `total_timeout_s` bounds a call including all its retries.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import openai
from openai.types.chat import ChatCompletion
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    wait_random_exponential,
)

from .base import ChatRequest, ChatResponse, ModelError, ModelToolCall, Usage
from .pricing import cost_usd
from .toolcalls import call_id, split_tool_calls, tool_names_of, under_grammar

_SEMAPHORES: dict[tuple[str, int], asyncio.Semaphore] = {}


class MalformedResponse(Exception):
    """The server answered 200 with something that is not a chat completion."""


def is_retryable(exc: BaseException) -> bool:
    """429, 5xx, timeouts, connection errors and malformed bodies are transient; every other error is final."""
    if isinstance(exc, (openai.APIConnectionError, MalformedResponse, json.JSONDecodeError,
                        openai.APIResponseValidationError)):  # APIConnectionError includes APITimeoutError
        return True
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code == 429 or exc.status_code >= 500
    return False


def _endpoint_semaphore(base_url: str, limit: int) -> asyncio.Semaphore:
    key = (base_url, id(asyncio.get_running_loop()))
    sem = _SEMAPHORES.get(key)
    if sem is None:
        sem = _SEMAPHORES[key] = asyncio.Semaphore(limit)
    return sem


class OpenAICompatModel:
    """Chat model behind an OpenAI-compatible `/chat/completions` endpoint."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str = "not-needed",
        *,
        max_concurrency: int = 4,
        max_retries: int = 4,
        attempt_timeout_s: float = 120.0,
        total_timeout_s: float = 600.0,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 20.0,
        client: Any | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.max_concurrency = max_concurrency
        self.max_retries = max_retries
        self.total_timeout_s = total_timeout_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self._secrets = (api_key,) if api_key != "not-needed" else ()
        self._client = client or openai.AsyncOpenAI(
            base_url=self.base_url, api_key=api_key, max_retries=0, timeout=attempt_timeout_s
        )
        self._schema_style = "json_schema"

    @property
    def identity(self) -> str:
        return f"openai-compat:{self.base_url}::{self.model}"

    def _response_format(self, schema: dict[str, Any]) -> dict[str, Any]:
        if self._schema_style == "json_schema":
            return {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}}
        return {"type": "json_object", "schema": schema}

    async def _create(self, body: dict[str, Any]) -> Any:
        """POST /chat/completions with `body` as given. The SDK's `chat.completions.create` first walks every
        message through its TypedDict transform (type introspection per value: measured 64% of `ecdysis
        serve`'s CPU per request, benchmarks/serve_overhead.py); our bodies are already plain JSON, so they go
        through the client's documented raw `post` (same retries, timeouts, errors and parsed reply)."""
        return await self._client.post("/chat/completions", body=body, cast_to=ChatCompletion)

    async def _attempt(self, request: ChatRequest) -> Any:
        p = request.params
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": [m.to_openai() for m in request.messages],
            "temperature": p.temperature,
            "max_tokens": p.max_tokens,
            "top_p": p.top_p,
        }
        if p.stop:
            kwargs["stop"] = p.stop
        if p.seed is not None or p.temperature > 0:  # a sampled reply depends on its request, not on the
            kwargs["seed"] = p.call_seed  # server's earlier calls (OpenAI's `seed`)
        if p.json_schema is not None:
            kwargs["response_format"] = self._response_format(p.json_schema)
        if p.tools:
            kwargs["tools"] = p.tools
            if p.tool_choice is not None:
                kwargs["tool_choice"] = p.tool_choice
        try:
            return _checked(await self._create(kwargs))
        except openai.APIStatusError as exc:
            # Some servers (llama-cpp-python) only take {"type": "json_object", "schema": ...}
            # and reject the OpenAI form with a 400, 422 or even a 500 naming response_format.
            rejects_style = exc.status_code in (400, 422) or "response_format" in str(exc)
            if p.json_schema is None or self._schema_style != "json_schema" or not rejects_style:
                raise
            self._schema_style = "json_object"
            kwargs["response_format"] = self._response_format(p.json_schema)
            return _checked(await self._create(kwargs))

    async def _with_retries(self, request: ChatRequest) -> tuple[Any, int]:
        """(completion, retries it took)."""
        retrying = AsyncRetrying(
            retry=retry_if_exception(is_retryable),
            stop=stop_after_attempt(self.max_retries + 1),
            wait=wait_random_exponential(multiplier=self.backoff_initial_s, max=self.backoff_max_s),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                return await self._attempt(request), attempt.retry_state.attempt_number - 1
        raise AssertionError("unreachable")

    async def chat(self, request: ChatRequest) -> ChatResponse:
        start = time.perf_counter()
        try:
            async with _endpoint_semaphore(self.base_url, self.max_concurrency):
                completion, retries = await asyncio.wait_for(
                    self._with_retries(request), timeout=self.total_timeout_s
                )
        except TimeoutError as exc:
            raise ModelError(
                f"{self.identity}: no reply within {self.total_timeout_s:.0f}s (total, with retries). "
                "Is the server overloaded? Raise total_timeout_s or lower concurrency.", self._secrets
            ) from exc
        except openai.APIConnectionError as exc:
            raise ModelError(
                f"{self.identity}: cannot reach {self.base_url} after {self.max_retries + 1} attempts "
                f"({exc.__class__.__name__}: {exc}). Is the server running and the URL right?", self._secrets
            ) from exc
        except openai.APIStatusError as exc:
            raise ModelError(f"{self.identity}: HTTP {exc.status_code}: {exc.message}", self._secrets) from exc
        except (MalformedResponse, json.JSONDecodeError, openai.APIResponseValidationError) as exc:
            raise ModelError(f"{self.identity}: malformed response after {self.max_retries + 1} attempts: "
                             f"{str(exc)[:300]}", self._secrets) from exc
        choice = completion.choices[0]
        u = completion.usage
        cached = 0
        if u is not None and getattr(u, "prompt_tokens_details", None) is not None:
            cached = getattr(u.prompt_tokens_details, "cached_tokens", 0) or 0
        usage = Usage(
            prompt_tokens=(u.prompt_tokens if u else 0) or 0,
            completion_tokens=(u.completion_tokens if u else 0) or 0,
            cached_tokens=cached,
        )
        if under_grammar(request.params):  # the server decodes a schema under a grammar, as the embedded backend
            usage.constrained_tokens = usage.completion_tokens
        text, calls = choice.message.content or "", []
        for index, c in enumerate(choice.message.tool_calls or []):
            fn = c.function
            calls.append(ModelToolCall(id=c.id or call_id(index, fn.name, fn.arguments or ""), name=fn.name,
                                  arguments=fn.arguments or "{}"))
        if not calls and request.params.tools:  # servers that return the template's text form
            text, calls = split_tool_calls(text, tool_names_of(request.params.tools))
        return ChatResponse(
            text=text,
            tool_calls=calls,
            finish_reason=choice.finish_reason or "stop",
            usage=usage,
            latency_s=time.perf_counter() - start,
            cost_usd=cost_usd(self.model, usage),
            model_id=self.identity,
            retries=retries,
        )


def _checked(completion: Any) -> Any:
    """The completion if it has the shape of one; MalformedResponse (retryable) otherwise."""
    choices = getattr(completion, "choices", None)
    if not isinstance(choices, list) or not choices or getattr(choices[0], "message", None) is None:
        raise MalformedResponse(f"not a chat completion: {str(completion)[:200]!r}")
    return completion
