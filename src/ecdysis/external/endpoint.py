"""The OpenAI-compatible endpoint agent programs talk to: one HTTP server on 127.0.0.1, a key per episode.

Routes: `POST /v1/chat/completions` (streaming and not), `GET /v1/models`, `GET /v1/models/{id}`,
`GET /health`. Every route but `/health` needs `Authorization: Bearer <key>` with the key of an episode that
is running: the key selects the episode (its harness, its model accounting, its trajectory); any other key,
or the key of an episode that has ended, gets 401. Keys are 256-bit random tokens handed to one process
only, in its environment. `POST /v1/responses` answers 404 saying to use Chat Completions.

Errors use the OpenAI error shape with `x-should-retry: false` (the model layer has already retried what was
transient; an SDK retrying would only repeat the failure): 400 bad request, 401 wrong key, 410 the episode
ended, 413 too large, 429 the episode's request budget is spent, 500 harness code failed, 502 the model failed
(also when an exact re-run asks something the stored episode never asked).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import secrets
import socket
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError

from ..serve.layers import HarnessRuntimeError
from ..serve.proxy import UpstreamError
from ..serve.wire import (
    ChatCompletionRequest,
    WireError,
    completion_body,
    completion_chunks,
    error_body,
    to_messages,
)
from .channel import EpisodeChannel, RequestRefused
from .program import MODEL_NAME

MAX_BODY_BYTES = 8_000_000
NO_RETRY = {"x-should-retry": "false"}


class Endpoint:
    """The server and the running episodes' keys. `start`/`stop` run in the event loop that serves."""

    def __init__(self) -> None:
        self.channels: dict[str, EpisodeChannel] = {}
        self.port = 0
        self._server: Any = None
        self._task: asyncio.Task[None] | None = None
        self._socket: socket.socket | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def register(self, channel: EpisodeChannel) -> str:
        key = "ecd-" + secrets.token_urlsafe(32)
        self.channels[key] = channel
        return key

    def revoke(self, key: str) -> None:
        channel = self.channels.pop(key, None)
        if channel is not None:
            channel.close()

    def channel(self, authorization: str) -> EpisodeChannel | None:
        given = authorization.removeprefix("Bearer ").strip().encode()
        for key, channel in list(self.channels.items()):
            if hmac.compare_digest(given, key.encode()):
                return channel
        return None

    async def start(self) -> None:
        import uvicorn

        class _Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:  # Ctrl-C stays the command's, not the endpoint's
                yield

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # replies go out at once (no 40 ms Nagle wait)
        sock.bind(("127.0.0.1", 0))
        sock.listen(256)
        self._socket, self.port = sock, sock.getsockname()[1]
        config = uvicorn.Config(create_app(self), log_level="warning", lifespan="off", access_log=False,
                                timeout_graceful_shutdown=2)
        self._server = _Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        self.loop = asyncio.get_running_loop()
        deadline = time.perf_counter() + 30
        while not self._server.started:
            if self._task.done() or time.perf_counter() > deadline:
                error = self._task.exception() if self._task.done() else None
                raise RuntimeError(f"the agent endpoint did not start: {error or 'timed out'}")
            await asyncio.sleep(0.005)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._task is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await self._task
        self.close()

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
        self._server = self._task = self._socket = None
        self.loop = None


def _error(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse(error_body(message, kind), status_code=status, headers=NO_RETRY)


def create_app(endpoint: Endpoint) -> FastAPI:
    """The ASGI app over `endpoint`'s running episodes."""
    app = FastAPI(title="ecdysis agent endpoint", docs_url=None, redoc_url=None, openapi_url=None)

    def card() -> dict[str, Any]:
        return {"id": MODEL_NAME, "object": "model", "created": int(time.time()), "owned_by": "ecdysis"}

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "episodes": len(endpoint.channels)}

    @app.get("/v1/models")
    async def models(request: Request) -> Any:
        if endpoint.channel(request.headers.get("authorization", "")) is None:
            return _error(401, "invalid API key: use the key in this episode's OPENAI_API_KEY", "authentication_error")
        return {"object": "list", "data": [card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str, request: Request) -> Any:
        if endpoint.channel(request.headers.get("authorization", "")) is None:
            return _error(401, "invalid API key: use the key in this episode's OPENAI_API_KEY", "authentication_error")
        return card() | {"id": model_id}

    @app.post("/v1/responses")
    async def responses() -> Any:
        return _error(404, "this endpoint speaks Chat Completions (POST /v1/chat/completions), not the Responses "
                      "API; e.g. OpenAI Agents SDK: set_default_openai_api('chat_completions')", "not_found_error")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        arrived = time.perf_counter()
        channel = endpoint.channel(request.headers.get("authorization", ""))
        if channel is None:
            return _error(401, "invalid API key: use the key in this episode's OPENAI_API_KEY (an episode's key "
                          "works only while it runs)", "authentication_error")
        raw = await request.body()
        if len(raw) > MAX_BODY_BYTES:
            channel.refuse(413, f"request body larger than {MAX_BODY_BYTES} bytes")
            return _error(413, f"request body larger than {MAX_BODY_BYTES} bytes", "invalid_request_error")
        try:
            req = ChatCompletionRequest.model_validate(json.loads(raw))
            req.check()
            messages = to_messages(req.messages)
        except (ValidationError, json.JSONDecodeError, WireError, ValueError) as exc:
            channel.refuse(400, str(exc))
            return _error(400, str(exc), "invalid_request_error")
        try:
            reply = await channel.turn(req, messages, arrived)
        except RequestRefused as exc:
            kind = "rate_limit_error" if exc.status == 429 else "invalid_request_error"
            return _error(exc.status, str(exc), kind)
        except UpstreamError as exc:
            return _error(502, str(exc), "upstream_error")
        except HarnessRuntimeError as exc:
            return _error(500, str(exc), "harness_error")
        completion_id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        if not req.stream:
            return JSONResponse(completion_body(reply, completion_id, req.model or MODEL_NAME))
        include_usage = bool((req.stream_options or {}).get("include_usage"))
        chunks = completion_chunks(reply, completion_id, req.model or MODEL_NAME, include_usage)

        async def events() -> AsyncIterator[bytes]:
            for chunk in chunks:
                yield f"data: {json.dumps(chunk)}\n\n".encode()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app
