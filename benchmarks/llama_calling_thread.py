"""Generation speed call after call through the embedded backend, from its one thread or from asyncio's pool.

    .venv/bin/python benchmarks/llama_calling_thread.py [--model qwen2.5-coder-1.5b] [--calls 8] [--gen 120]
        [--pool]

Sends `--calls` chats in a row (a fresh ~100-token prompt each, `--gen` greedy tokens) through
`LlamaCppModel.chat`, which runs every generation on the backend's one llama.cpp thread, and prints each call's
milliseconds per generated token from llama.cpp's own counters. `--pool` sends each generation from a thread of
its own, kept alive: what the backend's `asyncio.to_thread` did before 2026-12-04 whenever its pool started a
new worker (it does when the next call is submitted before the last worker is back to idle; in a run, with
episodes in flight, often). libgomp keeps one thread team per caller and, once the process holds more OpenMP
threads than CPUs, cuts every team's spinning short, so later calls run at passive-wait speed (docs/setup.md,
"One calling thread").
Run it on an idle machine.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))


async def run(model: Any, llama_cpp: Any, calls: int, gen: int, pool: bool) -> list[float]:
    from measure_rates import filler

    from ecdysis.models import ChatRequest, GenerationParams, Message
    from ecdysis.models.llama_local import load

    rng = random.Random(0)
    callers: list[ThreadPoolExecutor] = []
    ctx = load(model.path, model.n_ctx).llm._ctx.ctx
    per_token = []
    for i in range(calls + 1):  # the first call warms up and is not reported
        request = ChatRequest(messages=[Message(role="user", content=filler(90, rng) + " Write a long story.")],
                              params=GenerationParams(max_tokens=gen if i else 4, temperature=0.0, session=f"s{i}"))
        llama_cpp.llama_perf_context_reset(ctx)
        if pool:  # a thread of its own per call, kept alive as asyncio's pool keeps its workers
            callers.append(ThreadPoolExecutor(max_workers=1))
            await asyncio.get_running_loop().run_in_executor(callers[-1], model._generate, request, None)
        else:
            await model.chat(request)
        counters = llama_cpp.llama_perf_context(ctx)
        if i:
            per_token.append(counters.t_eval_ms / max(counters.n_eval, 1))
    for caller in callers:
        caller.shutdown()
    return per_token


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--gen", type=int, default=120)
    parser.add_argument("--pool", action="store_true",
                        help="each generation from a thread of its own (the old pool's worst case)")
    args = parser.parse_args()
    import os

    from ecdysis.models.llama_local import LlamaCppModel, _import_llama

    llama_cpp = _import_llama()
    model = LlamaCppModel(args.model, n_ctx=4096)
    per_token = asyncio.run(run(model, llama_cpp, args.calls, args.gen, args.pool))
    where = "a thread of its own each" if args.pool else "the backend's one thread"
    print(f"# {args.model}, {args.calls} calls x {args.gen} tokens from {where}; OMP_WAIT_POLICY="
          f"{os.environ.get('OMP_WAIT_POLICY')} GOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT')}, "
          f"load {os.getloadavg()[0]:.2f}")
    print("ms per generated token: " + " ".join(f"{x:.0f}" for x in per_token))
    return 0


if __name__ == "__main__":
    sys.exit(main())
