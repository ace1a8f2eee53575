"""Test helpers: harness versions built in code, and a chat function backed by a ScriptedModel."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ecdysis.harness.manifest import HarnessVersion, version_from_files
from ecdysis.models import ChatRequest, GenerationParams, Message, ScriptedModel
from ecdysis.workspace import seed_harness_dir


def seed_files(env: str) -> dict[str, str]:
    root = seed_harness_dir(env)
    return {p.relative_to(root).as_posix(): p.read_text() for p in root.rglob("*") if p.is_file()
            and "__pycache__" not in p.parts}


def seed_with(env: str, **changes: str) -> HarnessVersion:
    files = seed_files(env)
    files.update(changes)
    return version_from_files(files, origin=f"test-{env}")


def sync_chat(model: ScriptedModel) -> Callable[[list[dict[str, str]], dict[str, Any]], dict[str, Any]]:
    def chat(messages: list[dict[str, str]], params: dict[str, Any]) -> dict[str, Any]:
        request = ChatRequest(messages=[Message(**m) for m in messages], params=GenerationParams(**params))
        r = asyncio.run(model.chat(request))
        return {"text": r.text, "usage": r.usage.model_dump(), "latency_s": r.latency_s}

    return chat


def async_chat(responses: Sequence[str]) -> Callable[[list[dict[str, str]], dict[str, Any]], Awaitable[dict[str, Any]]]:
    model = ScriptedModel(list(responses))

    async def chat(messages: list[dict[str, str]], params: dict[str, Any]) -> dict[str, Any]:
        request = ChatRequest(messages=[Message(**m) for m in messages], params=GenerationParams(**params))
        r = await model.chat(request)
        return {"text": r.text, "usage": r.usage.model_dump(), "latency_s": r.latency_s}

    return chat
