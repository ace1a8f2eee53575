"""Multi-turn evaluation wall time by backend and concurrency, with prompt-cache accounting.

    .venv/bin/python benchmarks/serving.py [--tasks 6] [--model qwen2.5-coder-1.5b] [--data-dir ../shared/data]

DBBench dev tasks with the seed harness, response cache off, each setting in a fresh process (so no
setting inherits another's KV cache): the embedded backend at concurrency 1; 2 with episodes evicting each
other's KV (`slots` 1); 2 and 4 with every episode's KV kept (`slots` = concurrency: swapped in and out of
the one context); and llama-cpp-python's OpenAI-compatible server over the HTTP backend at concurrency 1
(the reference engine on this machine).
Prints wall time, prompt tokens sent, tokens served from the prefix cache, and ratios.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(model_ref: str, tasks: int, data_dir: str, concurrency: int, settings: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        args = [sys.executable, "-m", "ecdysis", "eval", "--env", "dbbench", "--split", "dev", "--limit", str(tasks),
                "--model", model_ref, "--concurrency", str(concurrency), "--data-dir", data_dir,
                "--run-dir", tmp, "--json", "--set", "cache.enabled=false"]
        for s in settings:
            args += ["--set", s]
        start = time.perf_counter()
        out = subprocess.run(args, capture_output=True, text=True, check=True, cwd=ROOT)
        wall = time.perf_counter() - start
    summary = json.loads(out.stdout)
    return {"wall_s": wall, "accuracy": summary["accuracy"], "prompt_tokens": summary["prompt_tokens"],
            "cached": summary.get("cached_prompt_tokens", 0), "completion_tokens": summary["completion_tokens"],
            "model_time_s": summary["model_time_s"]}


def llama_server(model: str) -> tuple[subprocess.Popen[bytes], str]:
    from ecdysis.models import local_models

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "llama_cpp.server", "--model",
                             str(local_models.resolve_verified(model)), "--model_alias", "m", "--host", "127.0.0.1",
                             "--port", str(port), "--n_ctx", "4096"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}/v1"
    for _ in range(600):
        try:
            urllib.request.urlopen(f"{base}/models", timeout=2).read()
            return proc, base
        except OSError:
            time.sleep(0.3)
    proc.kill()
    raise RuntimeError("llama-cpp-python server did not start")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=6)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    args = parser.parse_args()
    local = f"local:{args.model}"
    slots = f'model_settings."{local}".slots'
    settings = [(local, 1, [f"{slots}=1"], "embedded, concurrency 1"),
                (local, 2, [f"{slots}=1"], "embedded, concurrency 2, episodes evict each other"),
                (local, 2, [f"{slots}=2"], "embedded, concurrency 2, each episode's KV kept"),
                (local, 4, [f"{slots}=4"], "embedded, concurrency 4, each episode's KV kept")]
    results = []
    for ref, concurrency, extra, label in settings:
        results.append((label, run(ref, args.tasks, args.data_dir, concurrency, extra)))
        report(*results[-1])
    server, base = llama_server(args.model)
    try:
        results.append(("llama-cpp-python server (HTTP), concurrency 1",
                         run(f"{base}::m", args.tasks, args.data_dir, 1, [])))
        report(*results[-1])
    finally:
        server.kill()
    base_wall, best = results[0][1]["wall_s"], min(r["wall_s"] for _, r in results)
    for label, r in results:
        print(f"{label:48} {r['wall_s'] / base_wall:.2f}x concurrency 1, {r['wall_s'] / best:.2f}x the fastest")


def report(label: str, r: dict) -> None:
    rate = r["cached"] / r["prompt_tokens"] if r["prompt_tokens"] else 0.0
    print(f"{label:48} wall {r['wall_s']:6.1f}s  model {r['model_time_s']:6.1f}s  prompt tok {r['prompt_tokens']:6} "
          f"(prefix-cached {r['cached']:6}, {rate:.0%}; processed {r['prompt_tokens'] - r['cached']:6})  "
          f"completion tok {r['completion_tokens']:5}  acc {r['accuracy']:.2f}", flush=True)


if __name__ == "__main__":
    main()
