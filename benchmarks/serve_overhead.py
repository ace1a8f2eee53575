"""The proxy's own cost: `ecdysis serve` latency per request excluding the model, and throughput against the
upstream alone.

Three processes: a fake OpenAI-compatible upstream (answers after --delay-ms, alternating a native tool call
and a call written as JSON text with a string where the schema wants an integer, so H2's json_in_text and
coerce_types fire), `ecdysis serve` in front of it (recording on, a harness with contract, skills, demos, H4
and repairs), and this client: --conversations concurrent tool-calling conversations of --turns requests each
(the openai SDK, one AsyncOpenAI client), first straight to the upstream, then through the proxy.

Reported: the proxy's overhead per request as it measures it (X-Ecdysis-Overhead-Ms: request time minus
upstream time minus waiting for a slot; on a loaded machine this includes waiting for the CPU), the proxy
process's CPU time per request (recording and its upstream client included; robust to other load), the
client-side latency p50/p95 direct vs proxied, and requests/s direct vs proxied. Goal: overhead p50 < 5 ms at
16 concurrent conversations.

    .venv/bin/python benchmarks/serve_overhead.py [--conversations 16] [--turns 8] [--delay-ms 50] [--json out.json]
"""

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TOOL = {"type": "function", "function": {
    "name": "lookup_order", "description": "Look up an order by its number.",
    "parameters": {"type": "object", "properties": {"order_id": {"type": "integer"}}, "required": ["order_id"]}}}
REGULATE = '''from ecdysis.harness.api import StepState, Verdict


def regulate(state: StepState) -> Verdict:
    repeats = sum(1 for action, _ in state.history if action.key() == state.action.key())
    return Verdict(annotation="(You already made this exact call.)") if repeats else Verdict()
'''


def fake_upstream(port: int, delay_ms: float) -> None:
    """A minimal OpenAI-compatible server: every reply is a lookup_order call (native or as JSON text)."""
    import uvicorn
    from fastapi import FastAPI, Request

    app = FastAPI()
    count = {"n": 0}

    @app.post("/v1/chat/completions")
    async def complete(request: Request) -> dict[str, Any]:
        body = await request.json()
        count["n"] += 1
        await asyncio.sleep(delay_ms / 1000)
        turn = sum(1 for m in body["messages"] if m["role"] == "tool")
        message: dict[str, Any] = {"role": "assistant", "content": None}
        if count["n"] % 2:
            message["tool_calls"] = [{"id": f"c{count['n']}", "type": "function", "function": {
                "name": "lookup_order", "arguments": json.dumps({"order_id": turn})}}]
        else:
            message["content"] = json.dumps({"name": "lookup_order", "arguments": {"order_id": str(turn)}})
        return {"id": f"x{count['n']}", "object": "chat.completion", "created": 0, "model": "fake",
                "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
                "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}}

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_up(url: str, timeout: float = 60.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=1.0)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


def write_harness(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "harness.toml").write_text('name = "bench"\nenv = "bench"\ntool_calling = "native"\n\n[budget]\n'
                                       'max_turns = 50\nmax_rejections = 2\n\n[files]\naction = ""\n')
    (root / "contract.md").write_text("Look up orders before answering.\nTools:\n{tools}\n" + "Policy line.\n" * 40)
    (root / "skills.json").write_text(json.dumps([{"id": f"s{i}", "trigger": f"order status topic{i}",
                                                   "tip": f"Tip number {i}."} for i in range(20)]))
    (root / "demos.json").write_text(json.dumps([{"user": "Where is order 7?", "assistant": "Let me look."}]))
    (root / "regulate.py").write_text(REGULATE)
    (root / "repairs.json").write_text(json.dumps(["json_in_text", "coerce_types", "near_tool_name"]))
    return root


async def workload(base_url: str, conversations: int, turns: int, proxied: bool) -> dict[str, Any]:
    """`conversations` concurrent tool loops of `turns` requests; per-request client latency and overhead."""
    import openai

    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)
    latencies: list[float] = []
    overheads: list[float] = []
    errors = 0

    async def conversation(index: int) -> None:
        nonlocal errors
        messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a support agent."},
                                          {"role": "user", "content": f"status of order {index} please"}]
        for _ in range(turns):
            start = time.perf_counter()
            try:
                raw = await client.chat.completions.with_raw_response.create(
                    model="fake", messages=messages, tools=[TOOL],
                    extra_headers={"X-Ecdysis-Conversation": f"bench-{index}"})
            except openai.APIError:
                errors += 1
                return
            latencies.append(time.perf_counter() - start)
            if proxied:
                overheads.append(float(raw.headers["x-ecdysis-overhead-ms"]))
            message = raw.parse().choices[0].message
            calls = message.tool_calls or []
            if not calls:
                if not proxied:  # the upstream alone hands text calls to the agent as text
                    messages.append({"role": "assistant", "content": message.content or ""})
                    messages.append({"role": "user", "content": "go on"})
                    continue
                errors += 1
                return
            messages.append({"role": "assistant", "content": None, "tool_calls": [c.model_dump() for c in calls]})
            messages += [{"role": "tool", "tool_call_id": c.id, "content": f"order {c.function.arguments}: shipped"}
                         for c in calls]

    start = time.perf_counter()
    await asyncio.gather(*(conversation(i) for i in range(conversations)))
    wall = time.perf_counter() - start
    await client.close()

    def pct(values: list[float], q: float) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")

    out = {"requests": len(latencies), "errors": errors, "wall_s": round(wall, 3),
           "requests_per_s": round(len(latencies) / wall, 1),
           "latency_ms_p50": round(pct(latencies, 0.5) * 1000, 2),
           "latency_ms_p95": round(pct(latencies, 0.95) * 1000, 2)}
    if overheads:
        out |= {"overhead_ms_p50": round(pct(overheads, 0.5), 3), "overhead_ms_p95": round(pct(overheads, 0.95), 3),
                "overhead_ms_mean": round(statistics.fmean(overheads), 3), "overhead_ms_max": round(max(overheads), 3)}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=16)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--delay-ms", type=float, default=50.0, help="the fake upstream's time per reply")
    parser.add_argument("--trust-harness-code", action="store_true", help="harness code in the proxy process")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--fake-upstream", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.fake_upstream is not None:
        fake_upstream(args.fake_upstream, args.delay_ms)
        return 0
    ecdysis = Path(sys.executable).with_name("ecdysis")
    up_port, proxy_port = free_port(), free_port()
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="serve-bench-") as tmp:
        harness = write_harness(Path(tmp) / "harness")
        try:
            procs.append(subprocess.Popen([sys.executable, __file__, "--fake-upstream", str(up_port),
                                           "--delay-ms", str(args.delay_ms)]))
            wait_up(f"http://127.0.0.1:{up_port}/docs")
            procs.append(subprocess.Popen(
                [str(ecdysis), "serve", "--harness", str(harness), "--upstream",
                 f"http://127.0.0.1:{up_port}/v1::fake", "--port", str(proxy_port), "--store", f"{tmp}/store",
                 "--max-concurrency", str(max(16, args.conversations)), "--log-level", "warning",
                 *(["--trust-harness-code"] if args.trust_harness_code else [])],
                env={**os.environ, "PYTHONUNBUFFERED": "1"}))
            wait_up(f"http://127.0.0.1:{proxy_port}/health")
            for url, through in ((f"http://127.0.0.1:{up_port}/v1", False),
                                 (f"http://127.0.0.1:{proxy_port}/v1", True)):
                asyncio.run(workload(url, 2, 2, through))  # warm-up: first-use imports and connections
            direct = asyncio.run(workload(f"http://127.0.0.1:{up_port}/v1", args.conversations, args.turns, False))
            cpu = cpu_seconds(procs[1].pid)
            proxied = asyncio.run(workload(f"http://127.0.0.1:{proxy_port}/v1", args.conversations, args.turns, True))
            time.sleep(0.5)  # the recorder's last batch
            cpu = cpu_seconds(procs[1].pid) - cpu
            proxied["proxy_cpu_ms_per_request"] = round(cpu * 1000 / max(1, proxied["requests"]), 2)
        finally:
            for proc in reversed(procs):
                proc.terminate()
                proc.wait(timeout=30)
    result = {"harness_code": "in-process" if args.trust_harness_code else "sandboxed worker",
              "conversations": args.conversations, "turns": args.turns, "upstream_delay_ms": args.delay_ms,
              "cpus": os.cpu_count(), "direct": direct, "proxied": proxied}
    print(json.dumps(result, indent=1))
    print(f"proxy overhead per request p50 {proxied.get('overhead_ms_p50')} ms, "
          f"p95 {proxied.get('overhead_ms_p95')} ms "
          f"at {args.conversations} concurrent conversations "
          f"(proxy CPU {proxied['proxy_cpu_ms_per_request']} ms per request); "
          f"throughput {proxied['requests_per_s']} req/s proxied vs "
          f"{direct['requests_per_s']} req/s direct (upstream {args.delay_ms:g} ms per reply)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0 if not proxied["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
