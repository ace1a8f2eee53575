"""Prompt-processing and generation speed (tokens/s) of the installed llama-cpp-python build.

    .venv/bin/python benchmarks/llama_build_speed.py [--model qwen2.5-coder-1.5b] [--prompt 512] [--gen 64]
        [--repeats 3] [--threads N] [--json]

Prints the build's CPU features (llama_print_system_info), then per repeat the prompt-processing (pp) and
generation (tg) rates from llama.cpp's own counters (llama_perf_context), and their medians. Run it once per
build to compare them (e.g. the portable x86-64-v3 wheel of scripts/llama_wheel.sh in one venv, a
-march=native build in another) on an otherwise idle machine; each repeat starts from an empty KV cache.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path


def model_path(name: str) -> Path:
    from ecdysis.models.local_models import CATALOG, resolve_verified

    return resolve_verified(name) if name in CATALOG else Path(name).expanduser()


def measure(llm, prompt_tokens: list[int], gen: int) -> tuple[float, float]:
    """(pp tokens/s, tg tokens/s) of one run: the prompt in batches, then `gen` greedy tokens."""
    import llama_cpp

    llm.reset()
    llama_cpp.llama_perf_context_reset(llm._ctx.ctx)
    produced = 0
    for _ in llm.generate(prompt_tokens, temp=0.0, top_k=1, reset=True):
        produced += 1
        if produced >= gen:
            break
    perf = llama_cpp.llama_perf_context(llm._ctx.ctx)
    pp = perf.n_p_eval / (perf.t_p_eval_ms / 1000) if perf.t_p_eval_ms else 0.0
    tg = perf.n_eval / (perf.t_eval_ms / 1000) if perf.t_eval_ms else 0.0
    return pp, tg


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b", help="catalog name or path to a .gguf")
    parser.add_argument("--prompt", type=int, default=512, help="prompt tokens")
    parser.add_argument("--gen", type=int, default=64, help="generated tokens")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--json", action="store_true", help="one JSON object instead of text")
    args = parser.parse_args()
    from ecdysis.models.llama_local import openmp_defaults

    openmp_defaults()  # as the embedded backend runs it (override: OMP_WAIT_POLICY / GOMP_SPINCOUNT)
    import llama_cpp

    from ecdysis.doctor.llama import installed_wheel

    info = llama_cpp.llama_print_system_info()
    info = info.decode() if isinstance(info, bytes) else str(info)
    path = model_path(args.model)
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=args.prompt + args.gen + 64, n_batch=512,
                          n_threads=args.threads, verbose=False)
    words = "the harness turns model output into actions and checks them before they run ".split()
    text = " ".join(words[i % len(words)] for i in range(args.prompt * 2))
    tokens = llm.tokenize(text.encode())[: args.prompt]
    runs = [measure(llm, tokens, args.gen) for _ in range(args.repeats)]
    pp, tg = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
    result = {"llama_cpp_python": llama_cpp.__version__, "wheel": str(installed_wheel() or "not a cached wheel"),
              "system_info": info.strip(), "model": path.name, "threads": args.threads,
              "omp_wait_policy": os.environ["OMP_WAIT_POLICY"],
              "gomp_spincount": os.environ.get("GOMP_SPINCOUNT", "libgomp's default"),
              "prompt_tokens": len(tokens), "gen_tokens": args.gen, "runs": runs,
              "pp_tokens_per_s": round(pp, 1), "tg_tokens_per_s": round(tg, 1)}
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"llama-cpp-python {result['llama_cpp_python']} ({result['wheel']})")
    print(f"build: {result['system_info']}")
    print(f"model {path.name}, {args.threads} threads (OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}, "
          f"GOMP_SPINCOUNT={result['gomp_spincount']}), "
          f"{len(tokens)}-token prompt, {args.gen} generated tokens")
    for i, (p, t) in enumerate(runs, 1):
        print(f"  run {i}: pp {p:.1f} tok/s, tg {t:.1f} tok/s")
    print(f"median: pp {pp:.1f} tok/s, tg {tg:.1f} tok/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
