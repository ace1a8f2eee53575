"""A fault-injecting HTTP proxy for an OpenAI-compatible server (a real TCP server on 127.0.0.1).

Requests are served in arrival order from a plan; each entry is one fault or `pass` (forward to the
upstream server); after the plan, everything passes. Faults: `429`, `500`, `503`, `timeout` (answer after
the client gave up), `disconnect` (headers and half the body, then the connection drops), `garbage`
(200 with a body that is not JSON), `empty` (200 with JSON that is not a chat completion).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FaultProxy:
    def __init__(self, upstream: str, plan: list[str], slow_s: float = 6.0) -> None:
        self.upstream, self.plan, self.slow_s = upstream.rstrip("/"), list(plan), slow_s
        self.served: list[str] = []  # what each request got, in order
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                return None

            def do_GET(self) -> None:  # /v1/models and friends pass through
                self._forward(b"")

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with proxy.lock:
                    fault = proxy.plan.pop(0) if proxy.plan else "pass"
                    proxy.served.append(fault)
                try:
                    self._serve(fault, body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up first (the `timeout` fault)

            def _send(self, status: int, payload: bytes, headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(payload)

            def _serve(self, fault: str, body: bytes) -> None:
                error = json.dumps({"error": {"message": f"injected {fault}", "type": "server_error"}}).encode()
                if fault in ("429", "500", "503"):
                    self._send(int(fault), error, {"Retry-After": "0"} if fault == "429" else None)
                elif fault == "timeout":
                    time.sleep(proxy.slow_s)
                    self._forward(body)
                elif fault == "disconnect":
                    status, payload = proxy.upstream_call(self.path, body)
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload[: len(payload) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)
                elif fault == "garbage":
                    self._send(200, b"<html>upstream exploded \x00\x01")
                elif fault == "empty":
                    self._send(200, json.dumps({"object": "chat.completion", "choices": []}).encode())
                else:
                    self._forward(body)

            def _forward(self, body: bytes) -> None:
                status, payload = proxy.upstream_call(self.path, body)
                self._send(status, payload)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def upstream_call(self, path: str, body: bytes) -> tuple[int, bytes]:
        url = self.upstream.rsplit("/v1", 1)[0] + path
        request = urllib.request.Request(url, data=body or None, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=300) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
