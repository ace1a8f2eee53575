"""What putting Ecdysis between an agent program and its model costs: the same agent run straight against a model
server, then as an Ecdysis episode (its endpoint applying a harness, the model layer recording every call).

The agent is a small program using the plain `openai` client with one tool of its own (an expense-limit lookup):
it calls the tool, then answers. It times every model call it makes (what the agent itself waits for) and
appends the times to a file. The model server is, by default, a fake OpenAI-compatible server answering after
--delay-ms (so the difference is the endpoint's own cost, not model noise); with --model-url it is any server
you started (e.g. `python -m llama_cpp.server --model ~/.cache/ecdysis/models/<file>.gguf --port 8011`, then
--model-url http://127.0.0.1:8011/v1::qwen).

Reported, straight vs through Ecdysis: the agent's per-call latency p50/p95, the difference (the overhead per
call as the agent sees it), the endpoint's own overhead per request as it measures it (request time minus
model time), and episodes per minute at --concurrency episodes at once.

    .venv/bin/python benchmarks/agent_endpoint_overhead.py [--episodes 24] [--concurrency 2] [--delay-ms 50]
        [--repeats 2] [--model-url URL::MODEL] [--json out.json]
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

AGENT = '''import json, os, sys, time
import openai

TOOLS = [{"type": "function", "function": {"name": "policy_limit", "description": "The spending limit in dollars "
          "for an expense category (meals, travel, software).", "parameters": {"type": "object", "properties":
          {"category": {"type": "string"}}, "required": ["category"]}}}]
LIMITS = {"meals": 100, "travel": 500, "software": 300}
task = json.loads(sys.stdin.readline())
client = openai.OpenAI(max_retries=0)
messages = [{"role": "system", "content": "You review expenses. Use the tool, then answer approve or deny."},
            {"role": "user", "content": task["prompt"]}]
times = []
for _ in range(4):
    start = time.perf_counter()
    reply = client.chat.completions.create(model=os.environ.get("ECDYSIS_MODEL", "m"), messages=messages,
                                           tools=TOOLS, temperature=0, max_tokens=120).choices[0].message
    times.append(time.perf_counter() - start)
    if not reply.tool_calls:
        break
    messages.append(reply.model_dump(exclude_none=True))
    for call in reply.tool_calls:
        category = json.loads(call.function.arguments or "{}").get("category", "")
        messages.append({"role": "tool", "tool_call_id": call.id,
                         "content": f"The limit for {category} is ${LIMITS.get(category, 0)}."})
with open(os.environ["LATENCY_FILE"], "a") as f:
    f.write("".join(f"{t}\\n" for t in times))
print((reply.content or "").strip().splitlines()[-1] if reply.content else "")
'''


def fake_server(port: int, delay_ms: float) -> None:
    """An OpenAI-compatible server: the first reply calls the tool, the next answers."""
    import uvicorn
    from fastapi import FastAPI, Request

    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def complete(request: Request) -> dict[str, Any]:
        body = await request.json()
        await asyncio.sleep(delay_ms / 1000)
        user = next(m["content"] for m in body["messages"] if m["role"] == "user")
        category = next((c for c in ("meals", "travel", "software") if c in user), "meals")
        if not any(m["role"] == "tool" for m in body["messages"]):
            message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "policy_limit",
                                                                  "arguments": json.dumps({"category": category})}}]}
        else:
            message = {"role": "assistant", "content": "approve"}
        return {"id": "x", "object": "chat.completion", "created": 0, "model": "fake",
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 50, "completion_tokens": 5, "total_tokens": 55}}

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, timeout: float = 120) -> None:
    import httpx

    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            httpx.post(url + "/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "x"}],
                                                        "max_tokens": 1}, timeout=60)
            return
        except httpx.HTTPError:
            time.sleep(0.5)
    raise SystemExit(f"no model server at {url}")


def tasks(n: int) -> list[dict[str, Any]]:
    cats = ["meals", "travel", "software"]
    return [{"id": f"t{i}", "prompt": f"Employee {i} spent ${40 + 37 * i} on {cats[i % 3]}. Approve or deny?",
             "answer": "approve", "split": "test"} for i in range(n)]


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50": 0.0, "p95": 0.0, "n": 0}
    ordered = sorted(values)
    return {"p50": statistics.median(ordered), "p95": ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))],
            "n": len(ordered)}


async def straight(agent: Path, url: str, model: str, rows: list[dict[str, Any]], concurrency: int,
                   latency_file: Path) -> float:
    """Every task as a plain run of the agent against the model server; returns the wall time."""
    gate = asyncio.Semaphore(concurrency)
    env = {**os.environ, "OPENAI_BASE_URL": url, "OPENAI_API_KEY": "x", "ECDYSIS_MODEL": model,
           "LATENCY_FILE": str(latency_file)}

    async def one(row: dict[str, Any]) -> None:
        async with gate:
            proc = await asyncio.create_subprocess_exec(sys.executable, str(agent), stdin=subprocess.PIPE,
                                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                                        env=env, start_new_session=True)
            await proc.communicate(json.dumps({"id": row["id"], "prompt": row["prompt"], "public": {}}).encode())

    start = time.perf_counter()
    await asyncio.gather(*(one(r) for r in rows))
    return time.perf_counter() - start


async def through_ecdysis(agent: Path, ref: str, rows: list[dict[str, Any]], concurrency: int, latency_file: Path,
                          work: Path) -> tuple[float, list[float], dict[str, Any]]:
    """The same tasks as an Ecdysis evaluation of the agent program (response cache off: every call is made)."""
    from ecdysis.config import load_config
    from ecdysis.workspace import Workspace

    work.mkdir(parents=True, exist_ok=True)
    (work / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_config(None, ['env.name="jsonl"', f'env.options.path="{work / "tasks.jsonl"}"',
                             'env.options.grader="exact"', f'agent.command=["python", "{agent}"]',
                             f'agent.model="{ref}"', f'agent.env.LATENCY_FILE="{latency_file}"',
                             f'run.run_dir="{work / "run"}"', "run.progress=false", "cache.enabled=false",
                             f"run.concurrency={concurrency}", "sandbox.timeout_s=600"])
    ws = Workspace.open(cfg)
    ws.store.start_run("eval", {}, run_id="bench")
    summary = await ws.runner("bench").evaluate(ws.harness(), ws.tasks("test", None), 1, "test", "bench")
    trajectories = ws.store.trajectories(summary.eval_id)
    overhead = [r["overhead_ms"] for t in trajectories for r in t.of_kind("reply") if r.get("status") == 200]
    # the model layer's own time per call (cache lookup, accounting, the call's record): upstream time minus the
    # HTTP call's latency as the model client measured it
    replies = [r for t in trajectories for r in t.of_kind("reply") if r.get("status") == 200]
    models = [m for t in trajectories for m in t.of_kind("model")]
    layer = [1000 * (r["upstream_s"] - m["latency_s"]) for r, m in zip(replies, models, strict=False)]
    ws.close()
    return summary.wall_s, overhead, summary.terminations, layer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=24)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--delay-ms", type=float, default=50.0)
    parser.add_argument("--repeats", type=int, default=2, help="straight and through Ecdysis, alternated")
    parser.add_argument("--model-url", default="", help="URL::MODEL of a running OpenAI-compatible server")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    server = None
    if args.model_url:
        url, _, model = args.model_url.partition("::")
    else:
        port = free_port()
        here = str(Path(__file__).parent)
        server = subprocess.Popen([sys.executable, "-c", f"import sys; sys.path.insert(0, {here!r}); "
                                   f"import agent_endpoint_overhead as b; b.fake_server({port}, {args.delay_ms})"])
        url, model = f"http://127.0.0.1:{port}/v1", "fake"
    try:
        wait_for(url)
        rows = tasks(args.episodes)
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            agent = work / "agent.py"
            agent.write_text(AGENT)
            direct_file, via_file = work / "direct.txt", work / "via.txt"
            asyncio.run(straight(agent, url, model, rows[:2], args.concurrency, work / "warmup.txt"))  # not counted
            direct_wall = via_wall = 0.0
            overhead: list[float] = []
            layer: list[float] = []
            terminations: dict[str, int] = {}
            for repeat in range(args.repeats):  # alternated, so a change in the machine's load hits both alike
                direct_wall += asyncio.run(straight(agent, url, model, rows, args.concurrency, direct_file))
                layered_run = through_ecdysis(agent, f"{url}::{model}", rows, args.concurrency, via_file,
                                              work / f"r{repeat}")
                wall, more, ends, layered = asyncio.run(layered_run)
                via_wall, overhead, layer = via_wall + wall, overhead + more, layer + layered
                terminations = {k: terminations.get(k, 0) + v for k, v in ends.items()}
            direct = percentiles([float(x) * 1000 for x in direct_file.read_text().split()])
            via = percentiles([float(x) * 1000 for x in via_file.read_text().split()])
    finally:
        if server is not None:
            server.terminate()
    result = {
        "episodes": args.episodes, "repeats": args.repeats, "concurrency": args.concurrency,
        "model": args.model_url or f"fake server, {args.delay_ms:g} ms per reply",
        "agent_call_ms_straight": direct, "agent_call_ms_through_ecdysis": via,
        "added_per_call_ms": {"p50": via["p50"] - direct["p50"], "p95": via["p95"] - direct["p95"]},
        "endpoint_overhead_ms": percentiles(overhead),  # the endpoint's own time: request time minus model time
        "model_layer_ms": percentiles(layer),  # Ecdysis's model layer around each HTTP call to the model
        "episodes_per_min_straight": 60 * args.episodes * args.repeats / direct_wall,
        "episodes_per_min_through_ecdysis": 60 * args.episodes * args.repeats / via_wall,
        "terminations": terminations,
    }
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
