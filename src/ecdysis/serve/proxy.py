"""One turn of a served conversation: harness in, upstream call(s), harness out, one clean reply.

`Proxy.turn` is the whole contract: H3/H5/H4 prepare the upstream request (`ServedHarness.prepare`);
when H4 stops after the newest tool results the upstream is not called and the agent gets the stop
reason as text; otherwise the upstream reply goes through H2 against the request's tools, and a
rejected reply or an invalid call is sent back to the upstream model with the harness's feedback, at
most `retries` times. The agent sees only the final reply. Every turn is recorded.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from ..harness.api import Action
from ..harness.tool_calls import openai_tools
from ..models.base import ChatModel, ChatRequest, GenerationParams, Message
from .layers import ServedHarness, arguments_text, harness_reply, retry_messages
from .record import TraceRecorder, TurnRecord
from .sandboxed import Lineage
from .wire import ChatCompletionRequest, FinalReply, OutgoingCall, to_messages

log = logging.getLogger("ecdysis.serve")


class ServeSettings(BaseModel):
    """Limits and options of `ecdysis serve` (keys only ever come from environment variables)."""

    host: str = "127.0.0.1"
    port: int = 8000
    max_body_bytes: int = 4_000_000  # a larger request is refused with 413
    max_concurrency: int = 16  # requests processed at once (the upstream's own limit applies too)
    max_pending: int = 256  # requests in the proxy at once, waiting included; more get 429
    retries: int | None = None  # H2 retries per turn; default the harness's budget.max_rejections
    api_key_env: str | None = None  # if set, clients must send `Authorization: Bearer $VALUE`
    model_name: str | None = None  # the id /v1/models lists; default "ecdysis-<harness name>"
    upstream_retries: int = 2  # transient upstream failures retried by the model layer
    upstream_timeout_s: float = 300.0  # one upstream call, retries included
    trust_harness_code: bool = False  # run the harness's action.py/regulate.py in this process, not the sandbox


class UpstreamError(RuntimeError):
    """The upstream model failed for good (HTTP 502)."""


@dataclass
class TurnResult:
    reply: FinalReply
    record: TurnRecord
    events: list[dict[str, Any]] = field(default_factory=list)


def _call_id(conversation: str, turn: int, index: int, action: Action) -> str:
    digest = hashlib.sha256(f"{conversation}\0{turn}\0{index}\0{action.tool}\0{arguments_text(action)}".encode())
    return "call_" + digest.hexdigest()[:24]


class Proxy:
    """The harness, the upstream model and the recorder of one `serve` process."""

    def __init__(self, harness: ServedHarness, upstream: ChatModel, upstream_ref: str, settings: ServeSettings,
                 recorder: TraceRecorder | None = None) -> None:
        self.harness = harness
        self.upstream = upstream
        self.upstream_ref = upstream_ref
        self.settings = settings
        self.recorder = recorder
        self.retries = settings.retries if settings.retries is not None else harness.manifest.budget.max_rejections
        self.model_name = settings.model_name or f"ecdysis-{harness.name}"

    def params(self, req: ChatCompletionRequest, conversation: str) -> GenerationParams:
        """The request's sampling fields; those it leaves out come from the harness's generation settings. A
        sampled request without a seed gets a fresh random one (OpenAI's meaning: the backends seed every call from its
        request, so an unseeded sampled request would otherwise repeat the same completion)."""
        gen = self.harness.manifest.generation
        tools = req.tool_specs()
        temperature = req.temperature if req.temperature is not None else gen.temperature
        return GenerationParams(
            temperature=temperature,
            top_p=req.top_p if req.top_p is not None else gen.top_p,
            max_tokens=req.max_completion_tokens or req.max_tokens or gen.max_tokens,
            stop=req.stop_list() or list(gen.stop),
            seed=req.seed if req.seed is not None or not temperature else secrets.randbelow(2**31),
            json_schema=req.json_schema(),
            tools=openai_tools(tools) if tools else None, tool_choice=req.tool_choice if tools else None,
            session=conversation)

    async def _upstream(self, messages: list[Message], params: GenerationParams) -> Any:
        try:
            return await self.upstream.chat(ChatRequest(messages=messages, params=params))
        except Exception as exc:  # noqa: BLE001 - any upstream failure is a 502 with its message
            raise UpstreamError(f"upstream {self.upstream_ref} failed: {exc}") from exc

    async def turn(self, req: ChatCompletionRequest, messages: list[Message], conversation: str,
                   first_turn: bool, model_calls: int, turn_index: int) -> TurnResult:
        """Serve one request. Raises UpstreamError (502) or HarnessRuntimeError (500); the caller records those."""
        lineage = Lineage.of(messages)  # which sandboxed worker serves this conversation
        reply: Message | None = None
        try:
            result = await self._turn(req, messages, conversation, first_turn, model_calls, turn_index, lineage)
            reply = to_messages([result.reply.message()])[0]  # as the client will send it back
            return result
        finally:
            await self.harness.end_turn(lineage, reply)

    async def _turn(self, req: ChatCompletionRequest, messages: list[Message], conversation: str,
                    first_turn: bool, model_calls: int, turn_index: int, lineage: Lineage) -> TurnResult:
        started = time.time()
        clock = time.perf_counter()
        tools = req.tool_specs()
        prepared = await self.harness.prepare(messages, tools, lineage)
        events: list[dict[str, Any]] = []
        if first_turn:
            events.append({"kind": "prompt", "turn": turn_index, "system": prepared.system, "skills": prepared.skills,
                           "tips": prepared.tips, "tools": [t.to_record() for t in tools],
                           "task": prepared.task_prompt})
        for obs in prepared.observations:
            events.append({"kind": "observation", "turn": turn_index, "text": obs["text"]})
            if obs["text"].startswith("Error"):
                events.append({"kind": "tool_error", "turn": turn_index, "tool": obs["tool"], "error": "tool_error",
                               "text": obs["text"][:300]})
        events += [{"kind": "annotation", "turn": turn_index, "text": a} for a in prepared.annotations]
        record = TurnRecord(conversation=conversation, index=turn_index, started=started, latency_s=0.0,
                            upstream_s=0.0, overhead_ms=0.0, stream=req.stream, annotations=len(prepared.annotations))
        if prepared.stop is not None:
            reason = prepared.stop.reason or "the harness stopped the episode"
            events.append({"kind": "stop", "turn": turn_index, "reason": reason})
            record.stopped = reason
            return self._finish(TurnResult(FinalReply(content=f"Stopping here: {reason}."), record, events), clock)
        params = self.params(req, conversation)
        upstream_messages = list(prepared.messages)
        final: FinalReply | None = None
        for attempt in range(self.retries + 1):
            t = time.perf_counter()
            response = await self._upstream(upstream_messages, params)
            record.upstream_s += time.perf_counter() - t
            record.attempts += 1
            record.prompt_tokens += response.usage.prompt_tokens
            record.completion_tokens += response.usage.completion_tokens
            record.cached_tokens += response.usage.cached_tokens
            calls = [c.model_dump() for c in response.tool_calls]
            events.append({"kind": "model", "turn": turn_index, "reply": response.text, "tool_calls": calls,
                           "finish_reason": response.finish_reason, "usage": response.usage.model_dump(),
                           "latency_s": response.latency_s, "cache_hit": response.cache_hit,
                           "retries": response.retries})
            outcome = await self.harness.realize(harness_reply(response.text, calls), tools, model_calls + attempt,
                                                 prepared.task_prompt, lineage)
            record.repairs += outcome.repairs
            events += [{"kind": "repair", "turn": turn_index, "name": name} for name in outcome.repairs]
            if outcome.reject_rule:
                record.rejections.append(outcome.reject_rule)
                events.append({"kind": "rejection", "turn": turn_index, "feedback": outcome.feedback,
                               "rule": outcome.reject_rule})
            else:
                for a in outcome.actions:
                    events.append({"kind": "action", "turn": turn_index, "tool": a.tool, "input": a.input,
                                   "arguments": a.arguments})
                for a, kind, message in outcome.invalid:
                    record.rejections.append(kind)
                    events.append({"kind": "tool_error", "turn": turn_index, "tool": a.tool, "error": kind,
                                   "text": message})
            last = attempt == self.retries
            if outcome.accepted or last:
                record.gave_up = not outcome.accepted
                used = {c.id for m in messages for c in m.tool_calls or []}  # ids the client already has
                final = self._reply(outcome, response, calls, conversation, turn_index, used)
                break
            upstream_messages += retry_messages(response.text, calls, outcome)
        assert final is not None
        final.prompt_tokens, final.completion_tokens = record.prompt_tokens, record.completion_tokens
        record.tool_calls = len(final.tool_calls)
        return self._finish(TurnResult(final, record, events), clock)

    def _reply(self, outcome: Any, response: Any, calls: list[dict[str, Any]], conversation: str,
               turn: int, used: set[str]) -> FinalReply:
        """The reply the agent sees: realized calls as real `tool_calls` (canonical arguments), text as content.
        A reply still rejected after the last retry goes out as the upstream wrote it. A call keeps the upstream's
        id unless it has none, is a text call's, or the client has it already (`used`, or earlier in this reply):
        a model repeating a call may repeat its id (the embedded backend's ids hash the call), and agent
        frameworks skip a call whose id they have run."""
        def fresh(upstream_id: str, index: int, action: Action) -> str:
            keep = upstream_id and not upstream_id.startswith("text_call_") and upstream_id not in used
            out = upstream_id if keep else _call_id(conversation, turn, index, action)
            used.add(out)
            return out

        if outcome.reject_rule:
            return FinalReply(content=response.text, finish_reason="tool_calls" if calls else response.finish_reason,
                              tool_calls=[OutgoingCall(id=fresh(c["id"], i, Action(c["name"])),
                                                       name=c["name"], arguments=c["arguments"])
                                          for i, c in enumerate(calls)])
        out_calls = []
        for index, action in enumerate(a for a in outcome.actions if not (a.is_answer or a.is_respond)):
            out_calls.append(OutgoingCall(id=fresh(action.call_id, index, action), name=action.tool,
                                          arguments=arguments_text(action)))
        finish = "tool_calls" if out_calls else ("length" if response.finish_reason == "length" else "stop")
        return FinalReply(content=outcome.text.strip() if out_calls else outcome.text, tool_calls=out_calls,
                          finish_reason=finish)

    def _finish(self, result: TurnResult, clock: float) -> TurnResult:
        r = result.record
        r.latency_s = time.perf_counter() - clock
        r.overhead_ms = max(0.0, (r.latency_s - r.upstream_s) * 1000.0)
        return result

    def record(self, result: TurnResult, messages: list[Message]) -> None:
        """Queue the turn for the store (if recording) and log one line."""
        r = result.record
        log.info("conv=%s turn=%d status=%d attempts=%d repairs=%s rejections=%s latency=%.3fs overhead=%.2fms",
                 r.conversation, r.index, r.status, r.attempts, ",".join(r.repairs) or "-",
                 ",".join(r.rejections) or "-", r.latency_s, r.overhead_ms)
        if self.recorder is not None:
            self.recorder.submit(r.conversation, result.events, r, result.reply.message() if r.status == 200 else {},
                                 messages)
