"""Building and running the proxy: `build_proxy` (harness + upstream + recorder), `run` (uvicorn, blocking)
and `background` (uvicorn on a thread, for tests and benchmarks)."""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from ..models.base import ChatModel
from ..models.registry import ModelSettings, build_model
from .layers import ServedHarness
from .proxy import Proxy, ServeSettings
from .record import TraceRecorder

log = logging.getLogger("ecdysis.serve")


def build_proxy(harness_dir: Path | str, upstream_ref: str, settings: ServeSettings | None = None,
                store_dir: Path | str | None = None, upstream: ChatModel | None = None) -> Proxy:
    """Load the harness (HarnessError if it cannot be used), build the upstream from its reference
    (ModelConfigError for a bad reference or a missing key) unless `upstream` is given, and open the
    recording store (`store_dir` None: nothing is recorded)."""
    s = settings or ServeSettings()
    harness = ServedHarness(harness_dir, "inprocess" if s.trust_harness_code else "sandbox", s.max_concurrency)
    log.info("harness code: %s", harness.isolation)
    import jsonschema  # noqa: F401 - imported on first use by H2 validation and skill retrieval: not on
    import rank_bm25  # noqa: F401 - a request's clock
    if upstream is None:
        upstream = build_model(upstream_ref, ModelSettings(
            max_concurrency=s.max_concurrency, max_retries=s.upstream_retries,
            attempt_timeout_s=s.upstream_timeout_s, total_timeout_s=s.upstream_timeout_s,
            slots=min(s.max_concurrency, 8)))  # embedded backend: conversations whose KV state is kept
    recorder = None
    if store_dir is not None:
        recorder = TraceRecorder(store_dir, harness.version, upstream_ref,
                                 {"harness_dir": str(harness.root), **s.model_dump(exclude={"api_key_env"})})
    return Proxy(harness, upstream, upstream_ref, s, recorder)


def _server(proxy: Proxy, host: str, port: int, log_level: str):  # noqa: ANN202 - uvicorn.Server
    import uvicorn

    from .app import create_app

    config = uvicorn.Config(create_app(proxy), host=host, port=port, log_level=log_level, access_log=False,
                            limit_concurrency=proxy.settings.max_pending + 32, timeout_keep_alive=30)
    return uvicorn.Server(config)


def run(proxy: Proxy, log_level: str = "info") -> None:
    """Serve until interrupted; the recording is flushed and its run closed at the end."""
    logging.basicConfig(level=getattr(logging, log_level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    server = _server(proxy, proxy.settings.host, proxy.settings.port, log_level)

    def stopped(signum: int, frame: object) -> None:  # uvicorn re-raises SIGTERM after its graceful shutdown
        raise SystemExit(0)

    previous = signal.signal(signal.SIGTERM, stopped)
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        proxy.harness.close()
        if proxy.recorder is not None:
            proxy.recorder.close()


@contextlib.contextmanager
def background(proxy: Proxy, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning",
               close_recorder: bool = True) -> Iterator[str]:
    """Run the proxy on a thread; yields its base URL (`http://HOST:PORT/v1`, a free port when 0)."""
    server = _server(proxy, host, port, log_level)
    thread = threading.Thread(target=server.run, name="ecdysis-serve", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the proxy did not start")
        time.sleep(0.01)
    bound = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://{host}:{bound}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        proxy.harness.close()
        if close_recorder and proxy.recorder is not None:
            proxy.recorder.close()
