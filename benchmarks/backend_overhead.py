"""Overhead of the embedded backend (async interface, thread hop, lock, pydantic) over direct
llama-cpp-python calls on the same prompts and the same loaded model.

    .venv/bin/python benchmarks/backend_overhead.py [--model smollm2-135m] [--prompts 12] [--max-tokens 64]

Calls alternate (direct, backend, direct, backend, ...) so machine noise hits both alike. Greedy
decoding mostly gives the same tokens (llama.cpp's prompt-prefix reuse can change a few), so the
script also reports time per completion token.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from ecdysis.models import ChatRequest, GenerationParams, Message
from ecdysis.models.llama_local import _COMPUTE, LlamaCppModel, load_llama

PROMPTS = [
    "Explain what a hash table is.", "Write a haiku about rivers.", "What is 17 times 23?",
    "Name three prime numbers and say why they are prime.", "Describe the water cycle.",
    "Give a tip for writing clean code.", "What does HTTP stand for?", "Summarise the plot of Hamlet.",
    "How do vaccines work?", "List four sorting algorithms.", "What is a closure in Python?",
    "Why is the sky blue?", "Translate 'good morning' into French and Spanish.", "What is entropy?",
]


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    backend = LlamaCppModel(args.model)
    llm, _lock = load_llama(backend.path, backend.n_ctx, backend.n_threads)
    prompts = (PROMPTS * 4)[: args.prompts]
    # the direct calls run on the backend's llama.cpp thread too: one OpenMP team for both (a second calling
    # thread would get a team of its own and slow both to passive-wait speed: docs/setup.md)
    _COMPUTE.submit(llm.create_chat_completion, messages=[{"role": "user", "content": "warm up"}], max_tokens=8,
                    temperature=0.0).result()
    direct_s: list[float] = []
    backend_s: list[float] = []
    direct_tokens = backend_tokens = same = 0
    for prompt in prompts:
        messages = [{"role": "user", "content": prompt}]
        start = time.perf_counter()
        raw = _COMPUTE.submit(llm.create_chat_completion, messages=messages, max_tokens=args.max_tokens,
                              temperature=0.0, top_p=1.0).result()
        direct_s.append(time.perf_counter() - start)
        direct_tokens += raw["usage"]["completion_tokens"]
        request = ChatRequest(messages=[Message(role="user", content=prompt)],
                              params=GenerationParams(max_tokens=args.max_tokens, temperature=0.0))
        start = time.perf_counter()
        response = await backend.chat(request)
        backend_s.append(time.perf_counter() - start)
        backend_tokens += response.usage.completion_tokens
        same += response.text == raw["choices"][0]["message"]["content"]
    total_direct, total_backend = sum(direct_s), sum(backend_s)
    print(f"model={args.model} prompts={len(prompts)} max_tokens={args.max_tokens} "
          f"identical_outputs={same}/{len(prompts)}")
    print(f"direct llama-cpp-python: total {total_direct:.3f}s, median {statistics.median(direct_s) * 1000:.1f} ms")
    print(f"ecdysis embedded backend: total {total_backend:.3f}s, median {statistics.median(backend_s) * 1000:.1f} ms")
    ratio = total_backend / total_direct
    print(f"overhead ratio (wall): {ratio:.4f} ({(ratio - 1) * 100:+.2f}%)")
    per_direct, per_backend = total_direct / direct_tokens, total_backend / backend_tokens
    print(f"per completion token: direct {per_direct * 1000:.2f} ms ({direct_tokens} tokens), "
          f"backend {per_backend * 1000:.2f} ms ({backend_tokens} tokens); "
          f"ratio {per_backend / per_direct:.4f} ({(per_backend / per_direct - 1) * 100:+.2f}%)")


if __name__ == "__main__":
    asyncio.run(main())
