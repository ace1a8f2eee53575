"""Model references: short strings usable in config and on the command line.

    local:qwen2.5-coder-1.5b          embedded llama.cpp, catalog name (see `ecdysis models list`)
    local:/path/to/model.gguf         embedded llama.cpp, any GGUF file
    openai:gpt-4o-mini                api.openai.com, key from $OPENAI_API_KEY
    ollama:qwen2.5-coder:1.5b         Ollama on 127.0.0.1:11434, no key
    http://127.0.0.1:8080/v1::NAME    any OpenAI-compatible server; key from $ECDYSIS_API_KEY if set
    scripted:TEXT                     always replies TEXT (smoke tests; use ScriptedModel in code)
    scripted:@replies.json            plays a JSON list of replies (text or {"text", "tool_calls"}) in order
"""

from __future__ import annotations

import os
from typing import Annotated

from pydantic import BaseModel, Field

from .base import ChatModel, ModelConfigError
from .scripted import ScriptedModel

REFERENCE_FORMS = __doc__.split("\n\n", 1)[1].rstrip()


class ModelSettings(BaseModel):
    """Per-endpoint settings; the defaults suit a local server."""

    api_key_env: str | None = None
    max_concurrency: Annotated[int, Field(ge=1)] = 4
    max_retries: Annotated[int, Field(ge=0)] = 4
    attempt_timeout_s: Annotated[float, Field(gt=0)] = 120.0
    total_timeout_s: Annotated[float, Field(gt=0)] = 600.0
    n_ctx: Annotated[int, Field(ge=1)] = 4096
    # embedded backend: episodes whose KV cache is kept (1: they evict each other); default: run.concurrency
    slots: Annotated[int, Field(ge=1)] | None = None


def _key(env_name: str | None, required: bool) -> str:
    if env_name is None:
        return "not-needed"
    value = os.environ.get(env_name)
    if value:
        return value
    if required:
        raise ModelConfigError(f"missing API key: set the environment variable {env_name}")
    return "not-needed"


def _http(base_url: str, model: str, key: str, s: ModelSettings) -> ChatModel:
    from .openai_http import OpenAICompatModel

    return OpenAICompatModel(
        base_url,
        model,
        key,
        max_concurrency=s.max_concurrency,
        max_retries=s.max_retries,
        attempt_timeout_s=s.attempt_timeout_s,
        total_timeout_s=s.total_timeout_s,
    )


def build_model(ref: str, settings: ModelSettings | None = None, instance: str = "") -> ChatModel:
    """Build the backend a reference names. Raises ModelConfigError listing the known forms.

    `instance` gives an embedded model its own llama.cpp context (same weights file, separate KV cache).
    """
    s = settings or ModelSettings()
    kind, sep, rest = ref.partition(":")
    if ref.startswith(("http://", "https://")):
        base_url, sep2, model = ref.partition("::")
        if not sep2 or not model:
            raise ModelConfigError(f"model reference {ref!r} lacks '::MODEL'. Known forms:\n{REFERENCE_FORMS}")
        return _http(base_url, model, _key(s.api_key_env or "ECDYSIS_API_KEY", required=bool(s.api_key_env)), s)
    if not sep or not rest:
        raise ModelConfigError(f"unknown model reference {ref!r}. Known forms:\n{REFERENCE_FORMS}")
    if kind == "local":
        from .llama_local import LlamaCppModel

        return LlamaCppModel(rest, n_ctx=s.n_ctx, instance=instance, slots=s.slots or 1)
    if kind == "openai":
        return _http("https://api.openai.com/v1", rest, _key(s.api_key_env or "OPENAI_API_KEY", True), s)
    if kind == "ollama":
        return _http("http://127.0.0.1:11434/v1", rest, _key(s.api_key_env, False), s)
    if kind == "scripted" and rest.startswith("@"):
        from .scripted import from_file

        return from_file(rest[1:])
    if kind == "scripted":
        return ScriptedModel([rest], name=rest[:40])
    raise ModelConfigError(f"unknown model reference {ref!r}. Known forms:\n{REFERENCE_FORMS}")


def reference_problem(ref: str) -> str | None:
    """Why `ref` is not a model reference of a known form (None when it is one); nothing is built or loaded."""
    kind, sep, rest = ref.partition(":")
    if ref.startswith(("http://", "https://")):
        return None if ref.partition("::")[2] else f"model reference {ref!r} lacks '::MODEL'"
    if kind in ("local", "openai", "ollama", "scripted") and sep and rest:
        return None
    return f"unknown model reference {ref!r}"
