"""Multi-turn evaluation wall time on the embedded backend by concurrency and llama.cpp contexts.

    .venv/bin/python benchmarks/serving.py [--tasks 6] [--model qwen2.5-coder-1.5b] [--data-dir ../shared/data]

DBBench dev tasks with the seed harness, response cache off, each setting in a fresh process (so no
setting inherits another's KV cache): concurrency 1; concurrency 2 on one shared context (the old
default: episodes evict each other's KV); concurrency 2 and 4 with one context per episode (`slots`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(model: str, tasks: int, data_dir: str, concurrency: int, slots: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        args = [sys.executable, "-m", "ecdysis", "eval", "--env", "dbbench", "--split", "dev", "--limit", str(tasks),
                "--model", f"local:{model}", "--concurrency", str(concurrency), "--data-dir", data_dir,
                "--run-dir", tmp, "--json", "--set", "cache.enabled=false",
                "--set", f'model_settings."local:{model}".slots={slots}']
        start = time.perf_counter()
        out = subprocess.run(args, capture_output=True, text=True, check=True, cwd=ROOT)
        wall = time.perf_counter() - start
    summary = json.loads(out.stdout)
    return {"wall_s": wall, "accuracy": summary["accuracy"], "prompt_tokens": summary["prompt_tokens"],
            "completion_tokens": summary["completion_tokens"], "model_time_s": summary["model_time_s"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=6)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    args = parser.parse_args()
    settings = [(1, 1, "concurrency 1"), (2, 1, "concurrency 2, one shared context"),
                (2, 2, "concurrency 2, a context per episode"), (4, 4, "concurrency 4, a context per episode")]
    results = []
    for concurrency, slots, label in settings:
        r = run(args.model, args.tasks, args.data_dir, concurrency, slots)
        results.append((label, r))
        print(f"{label:40} wall {r['wall_s']:6.1f}s  model {r['model_time_s']:6.1f}s  prompt tok "
              f"{r['prompt_tokens']:6}  completion tok {r['completion_tokens']:5}  acc {r['accuracy']:.2f}", flush=True)
    base = results[0][1]["wall_s"]
    for label, r in results[1:]:
        print(f"{label:40} {r['wall_s'] / base:.2f}x the wall time of concurrency 1")


if __name__ == "__main__":
    main()
