"""Evaluation throughput against a local OpenAI-compatible llama.cpp server, framework vs. the server alone.

    .venv/bin/python benchmarks/http_throughput.py [--tasks 24] [--model smollm2-135m] [--max-tokens 48] [--explain]
                                                   [--pin] [--rounds 5] [--concurrency 1 4 16]

Starts llama-cpp-python's server on 127.0.0.1 with the model, then for concurrency 1, 4 and 16: runs an
`ecdysis` evaluation of a JSONL suite through the HTTP backend (sandboxed workers, store, cache off), and
replays the exact requests that evaluation sent straight to the server with the OpenAI client at the same
concurrency (no sandbox, no store), each episode's calls in order as an agent must send them. The ratio of
the two wall times is what the framework costs: the median over `--rounds` pairs of runs made back to back
(alternating which of the two goes first), since this machine's speed drifts more between runs than the
framework costs. Wall times shown are medians.
"""

from __future__ import annotations

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
import urllib.request
from pathlib import Path

import openai

from ecdysis.config import load_config
from ecdysis.harness.manifest import set_manifest_value
from ecdysis.models import local_models
from ecdysis.workspace import Workspace, seed_harness_dir


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(model_path: Path, port: int, pin: bool) -> subprocess.Popen[bytes]:
    """llama-cpp-python's server; with `pin`, on core 0 with one thread (the framework gets core 1),
    standing in for a model server on its own machine."""
    args = [sys.executable, "-m", "llama_cpp.server", "--model", str(model_path), "--model_alias", "bench",
            "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "2048"]
    if pin:
        args = ["taskset", "-c", "0", *args, "--n_threads", "1"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2).read()
            return proc
        except OSError:
            time.sleep(0.3)
    proc.kill()
    raise RuntimeError("llama.cpp server did not start")


async def framework(tmp: Path, base: str, tasks: int, concurrency: int, max_tokens: int,
                    explain: bool = False, label: str = "") -> tuple[float, list]:
    ask = "Explain step by step in a few sentences, then give the number." if explain else "Reply with the number."
    rows = [{"id": f"t{i}", "prompt": f"What is {i} plus {2 * i + 1}? {ask}", "answer": str(3 * i + 1),
             "split": "test"} for i in range(tasks)]
    (tmp / "tasks.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    harness = tmp / "harness"
    harness.mkdir(exist_ok=True)
    for path in seed_harness_dir("jsonl").iterdir():
        (harness / path.name).write_text(path.read_text())
    manifest = harness / "harness.toml"
    manifest.write_text(set_manifest_value(manifest.read_text(), "generation", "max_tokens", max_tokens))
    ref = f"{base}::bench"
    cfg = load_config(None, ['env.name="jsonl"', f'env.options.path="{tmp / "tasks.jsonl"}"',
                             f'agent.harness="{harness}"', f'agent.model="{ref}"', "run.progress=false",
                             f'run.run_dir="{tmp / f"run{concurrency}{label}"}"',
                             f"run.concurrency={concurrency}", "cache.enabled=false",
                             f'model_settings."{ref}".max_concurrency={concurrency}'])
    ws = Workspace.open(cfg)
    start = time.perf_counter()
    summary = await ws.runner("bench").evaluate(ws.harness(), ws.tasks("test", None), 1, "test", "eval")
    wall = time.perf_counter() - start
    requests = [[(e["messages"], e.get("usage", {})) for e in t.of_kind("model")]
                for t in ws.store.trajectories(summary.eval_id)]
    ws.close()
    return wall, requests


async def direct(base: str, episodes: list, concurrency: int, max_tokens: int) -> float:
    """The same requests straight to the server: `concurrency` episodes at a time, each episode's calls in
    order (an agent cannot send its next prompt before the reply it contains has arrived)."""
    client = openai.AsyncOpenAI(base_url=base, api_key="none", max_retries=0)
    semaphore = asyncio.Semaphore(concurrency)

    async def one(calls: list) -> None:
        async with semaphore:
            for messages, _ in calls:
                await client.chat.completions.create(model="bench", messages=messages, max_tokens=max_tokens,
                                                     temperature=0.0)

    start = time.perf_counter()
    await asyncio.gather(*(one(calls) for calls in episodes))
    wall = time.perf_counter() - start
    await client.close()
    return wall


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=24)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--explain", action="store_true", help="prompts that ask for longer replies")
    parser.add_argument("--pin", action="store_true", help="server on core 0, framework and client on core 1")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--rounds", type=int, default=5, help="framework and server-alone runs per concurrency")
    args = parser.parse_args()
    port = free_port()
    server = start_server(local_models.resolve_verified(args.model), port, args.pin)
    if args.pin:
        os.sched_setaffinity(0, {1})  # this process and the sandbox workers it starts
    base = f"http://127.0.0.1:{port}/v1"
    try:
        with tempfile.TemporaryDirectory() as tmp:
            await framework(Path(tmp), base, 4, 4, args.max_tokens)  # warm-up: server, imports, page cache
            print(f"{args.tasks} tasks, {args.model}, max_tokens {args.max_tokens}, explain {args.explain}, "
                  f"llama-cpp-python server{' pinned to core 0 (framework on core 1)' if args.pin else ''}")
            for concurrency in args.concurrency:
                walls: list[float] = []
                raws: list[float] = []
                episodes: list = []  # the requests of the latest framework run (the same in every round)
                for round_ in range(args.rounds):  # alternating which goes first, so drift hits both alike
                    if round_ % 2:
                        raws.append(await direct(base, episodes, concurrency, args.max_tokens))
                    wall, episodes = await framework(Path(tmp), base, args.tasks, concurrency, args.max_tokens,
                                                     args.explain, label=f"-{round_}")
                    walls.append(wall)
                    if not round_ % 2:
                        raws.append(await direct(base, episodes, concurrency, args.max_tokens))
                requests = [call for calls in episodes for call in calls]
                tokens = sum(u.get("completion_tokens", 0) for _, u in requests)
                wall, raw = statistics.median(walls), statistics.median(raws)
                ratios = [w / r for w, r in zip(walls, raws, strict=True)]  # each round's pair ran back to back
                rounds = " ".join(f"{r:.3f}" for r in ratios)
                print(f"concurrency {concurrency:2}: {len(requests)} calls, {tokens} completion tokens; "
                      f"framework {wall:6.2f}s ({len(requests) / wall:5.2f} req/s)  "
                      f"server alone {raw:6.2f}s ({len(requests) / raw:5.2f} req/s)  "
                      f"ratio {statistics.median(ratios):.3f} "
                      f"(median of {args.rounds} paired rounds: {rounds})",
                      flush=True)
    finally:
        server.kill()


if __name__ == "__main__":
    asyncio.run(main())
