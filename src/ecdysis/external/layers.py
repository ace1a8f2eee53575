"""The candidate harness as an agent program's endpoint applies it, and the model behind it.

`EpisodeLayers` is `serve`'s `ServedHarness` (H3/H5 into the messages, H4 on the tool results the agent
sends back, harness code sandboxed) with H2 realized as the library's own loop realizes it for a task: text
without a call is the final answer (not a reply to a user), with the task's declared answer set and the last
tool result in the context, so the trainer's replay of stored replies re-realizes them exactly as the
endpoint did. Harness code (`action.py`) runs in serve's sandboxed worker; its answers count as answers too.

`RunnerUpstream` is the upstream model of one episode: the runner's chat handler (the project's model layer:
response cache, accounting, budgets, recorded calls). It keeps each call's messages for the trajectory, which
is what exact replay matches requests against.

`LayerCache` builds a `ServedHarness` once per harness version (its sandbox workers are started in the
serving loop and stopped by `aclose`).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ..harness.api import Action, ActionContext, Reply, ToolSpec
from ..harness.manifest import HarnessVersion
from ..harness.tool_calls import native_realize
from ..models.base import ChatRequest, ChatResponse, Message, ModelError, ModelToolCall, Usage
from ..sandbox.host import ChatHandler
from ..serve.layers import Outcome, Prepared, ServedHarness, realize_outcome
from ..serve.sandboxed import Lineage


class RunnerUpstream:
    """A `ChatModel` over the runner's chat handler for one episode (trial `sample_index`)."""

    def __init__(self, chat: ChatHandler, identity: str, trial: int) -> None:
        self._chat = chat
        self._identity = identity
        self.trial = trial
        self.sent: list[list[dict[str, Any]]] = []  # the messages of each call that got a reply, in order

    @property
    def identity(self) -> str:
        return self._identity

    async def chat(self, request: ChatRequest) -> ChatResponse:
        messages = [m.model_dump(exclude_none=True) for m in request.messages]
        params = request.params.model_dump(exclude={"session"}) | {"sample_index": self.trial}
        out = await self._chat(messages, params)
        if "error" in out:
            raise ModelError(str(out["error"]))
        self.sent.append(messages)
        calls = [ModelToolCall(**c) for c in out.get("tool_calls") or []]
        return ChatResponse(text=out.get("text", ""), tool_calls=calls,
                            finish_reason=out.get("finish_reason") or "stop", usage=Usage(**(out.get("usage") or {})),
                            latency_s=float(out.get("latency_s", 0.0)), cache_hit=bool(out.get("cache_hit")),
                            retries=int(out.get("retries", 0)), model_id=self._identity)


class EpisodeLayers:
    """One episode's view of a served harness (what `serve.proxy.Proxy` drives)."""

    def __init__(self, served: ServedHarness, public: dict[str, Any]) -> None:
        self.served = served
        self.manifest = served.manifest
        self.name = served.name
        self.choices = tuple(str(c) for c in (public.get("choices") or ()))
        self.last_observation = ""  # the newest tool result the agent sent (H2's `last_observation`)

    async def prepare(self, messages: list[Message], tools: tuple[ToolSpec, ...], lineage: Lineage | None = None
                      ) -> Prepared:
        prepared = await self.served.prepare(messages, tools, lineage)
        if prepared.observations:
            self.last_observation = str(prepared.observations[-1]["text"])
        return prepared

    async def realize(self, reply: Reply, tools: tuple[ToolSpec, ...], turn: int, task_prompt: str,
                      lineage: Lineage | None = None) -> Outcome:
        if not self.served.has_action:  # the library's H2 only (no harness code): here, with the task's context
            ctx = ActionContext(tools, turn, task_prompt, False, self.choices, self.last_observation)
            return realize_outcome(native_realize, self.served.repairs, reply, tools, turn, task_prompt, ctx)
        outcome = await self.served.realize(reply, tools, turn, task_prompt, lineage)
        outcome.actions = [Action("answer", a.input) if a.is_respond else a for a in outcome.actions]
        return outcome


    async def end_turn(self, lineage: Lineage, reply: Message | None) -> None:
        """The request is over: its sandboxed worker is kept for the episode's next request, or ended."""
        await self.served.end_turn(lineage, reply)


class LayerCache:
    """Served harnesses by version id, built on first use (a harness that fails to load raises HarnessError)."""

    def __init__(self) -> None:
        self._served: dict[str, ServedHarness] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._root = Path(tempfile.mkdtemp(prefix="ecdysis-agent-harness-"))

    async def get(self, version: HarnessVersion) -> ServedHarness:
        lock = self._locks.setdefault(version.id, asyncio.Lock())
        async with lock:
            if version.id not in self._served:
                directory = self._root / version.id
                if not directory.exists():
                    version.write(directory)
                # loading probes harness code in a sandbox worker (a blocking start): off the serving loop
                self._served[version.id] = await asyncio.to_thread(ServedHarness, directory, "sandbox")
            return self._served[version.id]

    async def aclose(self) -> None:
        """Stop every served harness's sandbox workers (they belong to the loop that started them)."""
        served, self._served, self._locks = self._served, {}, {}
        for harness in served.values():
            await harness.aclose()

    def close(self) -> None:
        for harness in self._served.values():
            harness.close()
        self._served = {}
        shutil.rmtree(self._root, ignore_errors=True)
