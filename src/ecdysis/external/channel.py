"""One episode of an agent program as its endpoint sees it: every request, the harness applied, the trajectory.

A request goes through `serve.proxy.Proxy.turn` with the episode's `EpisodeLayers` (the candidate harness) and
`RunnerUpstream` (the runner's model layer), one request at a time per episode. The trajectory gets the event
kinds the library's own loop writes, so collect, aggregation, replay and the roles read it unchanged:
`prompt` (first request: system text the model got, tips, the agent's tools, the task), `model` (each
upstream call: its messages, reply, tool calls, usage, latency, cache hit), `repair`, `rejection`, `action`
(the realized calls the agent received; `answer` for a final text), `tool_error`, `observation` (each tool
result the agent sent back), `annotation`, `stop`; and its own: `request` (the messages new since the
previous request, the tools, the sampling fields), `reply` (what the agent got, status, latency, the
endpoint's own overhead) and `agent` (exit code, answer source, output tails), added by the executor.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Any

from ..agent.trajectory import Trajectory
from ..models.base import Message
from ..serve.proxy import Proxy, ServeSettings, UpstreamError
from ..serve.wire import ChatCompletionRequest, FinalReply
from .layers import EpisodeLayers, RunnerUpstream

PARAM_FIELDS = ("temperature", "top_p", "max_tokens", "max_completion_tokens", "stop", "seed", "tool_choice",
                "response_format")


class RequestRefused(RuntimeError):
    """The episode may not make this request (its request budget is spent, or it has ended): HTTP 429 / 410."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _flat(m: Message) -> dict[str, Any]:
    return m.model_dump(exclude_none=True)


class EpisodeChannel:
    """The endpoint side of one episode: serves its requests and builds its trajectory."""

    def __init__(self, traj: Trajectory, layers: EpisodeLayers, upstream: RunnerUpstream, conversation: str,
                 max_requests: int) -> None:
        self.traj = traj
        self.layers = layers
        self.upstream = upstream
        self.conversation = conversation  # call ids are derived from it: the same in a re-run
        self.max_requests = max_requests
        self.proxy = Proxy(layers, upstream, upstream.identity, ServeSettings())  # type: ignore[arg-type]
        self.lock = asyncio.Lock()
        self.requests = 0
        self.model_calls = 0
        self.previous: list[dict[str, Any]] = []  # the last request's messages and the reply it got
        self.upstream_error = ""
        self.stopped = ""
        self.over_budget = False
        self.closed = False
        self.in_flight: set[asyncio.Task[Any]] = set()

    def _add(self, kind: str, turn: int, **data: Any) -> None:
        if not self.closed:
            self.traj.add(kind, turn, **data)

    def refuse(self, status: int, message: str, turn: int | None = None) -> None:
        """Record a request the endpoint refused (bad JSON, over budget)."""
        self._add("reply", self.requests if turn is None else turn, status=status, error=message[:2000])

    async def turn(self, req: ChatCompletionRequest, messages: list[Message], arrived: float) -> FinalReply:
        """Serve one request. Raises RequestRefused, UpstreamError (502) or HarnessRuntimeError (500); each
        is recorded first."""
        inner = asyncio.create_task(self._locked_turn(req, messages, arrived))
        self.in_flight.add(inner)
        try:
            return await inner
        except asyncio.CancelledError:
            if inner.cancelled() and self.closed:  # cancelled by `close`, not by our caller
                raise RequestRefused(410, "this episode has ended") from None
            raise
        finally:
            self.in_flight.discard(inner)

    async def _locked_turn(self, req: ChatCompletionRequest, messages: list[Message], arrived: float) -> FinalReply:
        async with self.lock:
            return await self._turn(req, messages, arrived)

    async def _turn(self, req: ChatCompletionRequest, messages: list[Message], arrived: float) -> FinalReply:
        if self.closed:
            raise RequestRefused(410, "this episode has ended")
        index = self.requests
        if index >= self.max_requests:
            self.over_budget = True
            self.refuse(429, f"request budget spent ({self.max_requests} per episode: agent.max_requests)", index)
            raise RequestRefused(429, f"this episode's request budget ({self.max_requests}) is spent")
        self.requests += 1
        flat = [_flat(m) for m in messages]
        same = next((i for i, (a, b) in enumerate(zip(flat, self.previous, strict=False)) if a != b),
                    min(len(flat), len(self.previous)))
        params = {k: v for k in PARAM_FIELDS if (v := getattr(req, k, None)) is not None}
        self._add("request", index, messages=flat[same:], from_message=same, stream=req.stream, params=params,
                  tools=[t.name for t in req.tool_specs()])
        self.upstream.sent.clear()
        first = not self.traj.of_kind("prompt")
        waited = time.perf_counter()
        try:
            result = await self.proxy.turn(req, messages, self.conversation, first, self.model_calls, index)
        except Exception as exc:
            status = 502 if isinstance(exc, UpstreamError) else 500
            self.upstream_error = self.upstream_error or (str(exc) if status == 502 else "")
            self._add("reply", index, status=status, error=str(exc)[:2000], latency_s=time.perf_counter() - arrived)
            raise
        record = result.record
        calls = iter(self.upstream.sent)
        for event in result.events:
            if event["kind"] == "model":
                event["messages"] = next(calls, [])
                self._account(event)
            if event["kind"] == "prompt" and not first:
                continue
            if not self.closed:
                self.traj.events.append(event)
        if not first:  # the tools the agent offers now (replay realizes with the latest ones)
            prompt = self.traj.of_kind("prompt")
            if prompt:
                prompt[0]["tools"] = [t.to_record() for t in req.tool_specs()]
        self.model_calls += record.attempts
        reply = result.reply
        answers = [e for e in result.events if e["kind"] == "action" and e["tool"] == "answer"]
        if answers and not reply.tool_calls and not record.gave_up and not record.stopped:
            reply.content = str(answers[-1]["input"])  # H2's answer (an answer repair may have changed it)
        for position, call in enumerate(reply.tool_calls):
            call.id = call_id(self.conversation, index, position, call.name, call.arguments)
        if record.stopped:
            self.stopped = record.stopped
        latency = time.perf_counter() - arrived
        self._add("reply", index, status=200, message=_reply_message(reply), attempts=record.attempts,
                  repairs=list(record.repairs), rejections=list(record.rejections), gave_up=record.gave_up,
                  latency_s=round(latency, 6), upstream_s=round(record.upstream_s, 6),
                  queued_s=round(waited - arrived, 6),
                  overhead_ms=round(max(0.0, latency - record.upstream_s) * 1000.0, 3))
        self.previous = flat + [_reply_message(reply)]
        if not self.closed:
            self.traj.conversation = [f for f in flat if f["role"] != "system"] + [_reply_message(reply)]
        return reply

    def _account(self, event: dict[str, Any]) -> None:
        usage = event.get("usage") or {}
        self.traj.model_calls += 1
        self.traj.cache_hits += int(bool(event.get("cache_hit")))
        self.traj.model_time_s += float(event.get("latency_s", 0.0))
        self.traj.prompt_tokens += int(usage.get("prompt_tokens", 0))
        self.traj.completion_tokens += int(usage.get("completion_tokens", 0))

    def close(self) -> None:
        """The episode ended: later requests are refused, requests still in flight are cancelled."""
        self.closed = True
        for task in list(self.in_flight):
            task.cancel()


def call_id(conversation: str, request: int, position: int, name: str, arguments: str) -> str:
    """The id of a call the agent receives: unique in its episode (frameworks skip a call id they have run
    already, and a model repeating a call may repeat its id) and the same in an exact re-run."""
    digest = hashlib.sha256(f"{conversation}\0{request}\0{position}\0{name}\0{arguments}".encode())
    return "call_" + digest.hexdigest()[:24]


def _reply_message(reply: FinalReply) -> dict[str, Any]:
    """The reply as a flat message (the library's conversation format: calls as {id, name, arguments})."""
    out: dict[str, Any] = {"role": "assistant", "content": reply.content or ""}
    if reply.tool_calls:
        out["tool_calls"] = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in reply.tool_calls]
    return out
