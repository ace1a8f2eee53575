"""The HTTP side of `ecdysis serve` (FastAPI + uvicorn): OpenAI-compatible routes over a `Proxy`.

Routes: `POST /v1/chat/completions` (streaming and not), `GET /v1/models`, `GET /v1/models/{id}`,
`POST /v1/conversations/{id}/outcome`, `GET /health`. Headers the proxy reads:
`X-Ecdysis-Conversation` (the conversation id; else derived from the conversation's prefix) and
`X-Ecdysis-Outcome` (pass | fail | a score, attached to that conversation); headers it sets:
`X-Ecdysis-Conversation`, `X-Ecdysis-Attempts`, `X-Ecdysis-Repairs`, `X-Ecdysis-Overhead-Ms`.

Errors use the OpenAI error shape: 400 bad request, 401 wrong key, 413 too large, 429 too many
requests in the proxy, 500 harness code failed, 502 the upstream model failed (with its message).
A streamed reply is sent once the harness accepted it (H2 must see the whole reply first).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError

from .layers import HarnessRuntimeError
from .proxy import Proxy, TurnResult, UpstreamError
from .record import ConversationOutcome, TurnRecord, derived_conversation_id, parse_outcome_header
from .wire import ChatCompletionRequest, WireError, completion_body, completion_chunks, error_body, to_messages

log = logging.getLogger("ecdysis.serve")
CONVERSATION_HEADER, OUTCOME_HEADER = "x-ecdysis-conversation", "x-ecdysis-outcome"


def _error(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse(error_body(message, kind), status_code=status)


def create_app(proxy: Proxy) -> FastAPI:
    """The ASGI app serving `proxy`. The recorder (if any) is flushed and closed at shutdown."""
    settings = proxy.settings
    key = os.environ.get(settings.api_key_env, "") if settings.api_key_env else ""
    if settings.api_key_env and not key:
        raise ValueError(f"--api-key-env {settings.api_key_env}: that environment variable is not set")
    busy = asyncio.Semaphore(settings.max_concurrency)
    state = {"pending": 0}

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        log.info("serving harness %s (%s) with upstream %s", proxy.harness.name, proxy.harness.id, proxy.upstream_ref)
        yield
        await proxy.harness.aclose()
        if proxy.recorder is not None:
            await proxy.recorder.flush()

    app = FastAPI(title="ecdysis serve", lifespan=lifespan, docs_url=None, redoc_url=None)

    def authorized(request: Request) -> bool:
        if not key:
            return True
        given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        return hmac.compare_digest(given.encode(), key.encode())

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "harness": proxy.harness.id, "harness_name": proxy.harness.name,
                "upstream": proxy.upstream_ref, "recording": proxy.recorder is not None}

    def model_card() -> dict[str, Any]:
        return {"id": proxy.model_name, "object": "model", "created": int(time.time()), "owned_by": "ecdysis"}

    @app.get("/v1/models")
    async def models(request: Request) -> Any:
        if not authorized(request):
            return _error(401, "invalid API key", "authentication_error")
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str, request: Request) -> Any:
        if not authorized(request):
            return _error(401, "invalid API key", "authentication_error")
        if model_id != proxy.model_name:
            return _error(404, f"no model {model_id!r}; this proxy serves {proxy.model_name!r}", "not_found_error")
        return model_card()

    @app.post("/v1/conversations/{conversation}/outcome")
    async def outcome(conversation: str, request: Request) -> Any:
        if not authorized(request):
            return _error(401, "invalid API key", "authentication_error")
        if proxy.recorder is None:
            return _error(409, "recording is off (serve was started with --no-record)", "invalid_request_error")
        try:
            body = ConversationOutcome.model_validate_json(await request.body())
            body.resolved()
        except (ValidationError, ValueError) as exc:
            return _error(400, f"outcome: {exc}", "invalid_request_error")
        found = await proxy.recorder.attach_outcome(conversation, body)
        if not found:
            return _error(404, f"no recorded conversation {conversation!r}", "not_found_error")
        score, passed = body.resolved()
        return {"conversation": conversation, "score": score, "passed": passed}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        arrived = time.perf_counter()
        if not authorized(request):
            return _error(401, "invalid API key", "authentication_error")
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > settings.max_body_bytes:
            return _error(413, f"request body larger than {settings.max_body_bytes} bytes", "invalid_request_error")
        raw = await request.body()
        if len(raw) > settings.max_body_bytes:
            return _error(413, f"request body larger than {settings.max_body_bytes} bytes", "invalid_request_error")
        try:
            req = ChatCompletionRequest.model_validate(json.loads(raw))
            req.check()
            messages = to_messages(req.messages)
            outcome_header = request.headers.get(OUTCOME_HEADER)
            attached = parse_outcome_header(outcome_header) if outcome_header else None
        except (ValidationError, json.JSONDecodeError, WireError, ValueError) as exc:
            return _error(400, str(exc), "invalid_request_error")
        conversation = request.headers.get(CONVERSATION_HEADER) or derived_conversation_id(messages)
        if state["pending"] >= settings.max_pending:
            return _error(429, f"the proxy has {settings.max_pending} requests in flight; retry later",
                          "rate_limit_error")
        state["pending"] += 1
        try:
            result = await _serve(proxy, busy, req, messages, conversation, arrived)
        finally:
            state["pending"] -= 1
        if attached is not None and proxy.recorder is not None:
            proxy.recorder.attach_outcome(conversation, attached)
        if isinstance(result, JSONResponse):
            return result
        headers = {CONVERSATION_HEADER: conversation, "x-ecdysis-attempts": str(result.record.attempts),
                   "x-ecdysis-repairs": ",".join(result.record.repairs),
                   "x-ecdysis-overhead-ms": f"{result.record.overhead_ms:.3f}"}
        completion_id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        if not req.stream:
            return JSONResponse(completion_body(result.reply, completion_id, proxy.model_name), headers=headers)
        include_usage = bool((req.stream_options or {}).get("include_usage"))
        chunks = completion_chunks(result.reply, completion_id, proxy.model_name, include_usage)

        async def events() -> AsyncIterator[bytes]:
            for chunk in chunks:
                yield f"data: {json.dumps(chunk)}\n\n".encode()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream", headers=headers)

    return app


async def _serve(proxy: Proxy, busy: asyncio.Semaphore, req: ChatCompletionRequest, messages: list[Any],
                 conversation: str, arrived: float) -> TurnResult | JSONResponse:
    """Run one turn under the concurrency bound and the conversation's lock; record it, errors included."""
    recorder = proxy.recorder
    live = recorder.live(conversation) if recorder is not None else None
    waited = time.perf_counter()
    async with busy:
        if live is not None:
            await live.lock.acquire()
        queued = time.perf_counter() - waited
        try:
            index = live.turns if live is not None else 0
            try:
                result = await proxy.turn(req, messages, conversation, index == 0,
                                          live.model_calls if live is not None else 0, index)
            except (UpstreamError, HarnessRuntimeError) as exc:
                status, kind = (502, "upstream_error") if isinstance(exc, UpstreamError) else (500, "harness_error")
                log.warning("conv=%s turn=%d %d: %s", conversation, index, status, exc)
                latency = time.perf_counter() - arrived
                record = TurnRecord(conversation=conversation, index=index, started=time.time() - latency,
                                    latency_s=latency, upstream_s=0.0, overhead_ms=0.0, stream=req.stream,
                                    status=status, error=str(exc)[:2000])
                if recorder is not None and live is not None:
                    live.turns += 1
                    recorder.submit(conversation, [], record, {}, messages)
                return _error(status, str(exc), kind)
            if live is not None:
                live.turns += 1
                live.model_calls += result.record.attempts
            r = result.record
            r.latency_s = time.perf_counter() - arrived  # parsing included, waiting for a slot excluded below
            r.overhead_ms = max(0.0, (r.latency_s - queued - r.upstream_s) * 1000.0)
            proxy.record(result, messages)
            return result
        finally:
            if live is not None:
                live.lock.release()
