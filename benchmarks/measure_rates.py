"""Measure a catalog model's charged-time rates (or the sandbox's per-episode cost) and print the rates.toml entry.

    .venv/bin/python benchmarks/measure_rates.py --model qwen2.5-coder-1.5b [--prompts 64,256,512]
        [--gens 1,32,96] [--repeats 2]
    .venv/bin/python benchmarks/measure_rates.py --sandbox [--episodes 24] [--concurrency 2]
    .venv/bin/python benchmarks/measure_rates.py --check TASKS.jsonl --grader G --model NAME [--tasks 8]

Model: every (prompt tokens, generated tokens) pair is sent `repeats` times through the embedded backend exactly
as a run sends it (`LlamaCppModel.chat`: chat template, one call at a time); each prompt starts with a fresh
random word so the context's prefix cache cannot serve it (what it still serves is taken off, as the charge
does). The fit is least squares of latency = call_s + fresh prompt tokens / prompt_tok_s + completion tokens /
gen_tok_s. Sandbox: an evaluation of `--episodes` one-line tasks whose model replies at once (scripted), at the
runs' concurrency: wall time per episode. Check: a cold evaluation (a fresh response cache) of `--tasks` tasks
of a suite with the real model, its real wall time beside its charged time (calls + episodes).
Run it on an idle machine: the 1-minute load average is printed with the entry and in its `measured` note.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import tempfile
import time
from pathlib import Path


def load_note() -> str:
    one, five, _ = os.getloadavg()
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    return f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores {cpu}, load {one:.2f}/{five:.2f} (1/5 min)"


def filler(n_words: int, rng: random.Random) -> str:
    words = "the harness turns model output into actions and checks them before they run".split()
    return " ".join([f"zq{rng.randrange(10**9)}"] + [words[i % len(words)] for i in range(n_words)])


async def measure_model(name: str, prompts: list[int], gens: list[int], repeats: int) -> dict[str, object]:
    import numpy as np

    from ecdysis.models import ChatRequest, GenerationParams, Message
    from ecdysis.models.llama_local import LlamaCppModel

    model = LlamaCppModel(name, n_ctx=4096)
    rng = random.Random(0)
    rows = []
    await model.chat(ChatRequest(messages=[Message(role="user", content="warm up")],
                                 params=GenerationParams(max_tokens=4)))  # loading is not a call's cost
    for _ in range(repeats):
        for p in prompts:
            for g in gens:
                text = filler(max(p - 20, 1), rng) + "\nNow write a long essay about sandboxes, never stopping early."
                request = ChatRequest(messages=[Message(role="user", content=text)],
                                      params=GenerationParams(max_tokens=g, temperature=0.0, session=f"m{len(rows)}"))
                start = time.perf_counter()
                response = await model.chat(request)
                elapsed = time.perf_counter() - start
                u = response.usage
                rows.append((u.prompt_tokens - u.cached_tokens, u.completion_tokens, elapsed))
                print(f"  prompt {u.prompt_tokens} ({u.cached_tokens} prefix-cached), generated "
                      f"{u.completion_tokens}: {elapsed:.2f} s", flush=True)
    design = np.array([[1.0, fresh, gen] for fresh, gen, _ in rows])
    (call_s, per_prompt, per_gen), *_ = np.linalg.lstsq(design, np.array([r[2] for r in rows]), rcond=None)
    predicted = design @ np.array([call_s, per_prompt, per_gen])
    error = float(np.max(np.abs(predicted - np.array([r[2] for r in rows])) / np.array([r[2] for r in rows])))
    return {"prompt_tok_s": round(1 / per_prompt, 1), "gen_tok_s": round(1 / per_gen, 2),
            "call_s": round(max(float(call_s), 0.0), 3), "calls": len(rows), "max_relative_error": round(error, 3)}


def tasks_file(directory: Path, n: int) -> Path:
    path = directory / "tasks.jsonl"
    path.write_text("".join(json.dumps({"id": f"s{i}", "prompt": f"Say {i}.", "answer": str(i), "split": "test"})
                            + "\n" for i in range(n)))
    return path


async def measure_sandbox(episodes: int, concurrency: int) -> dict[str, object]:
    from ecdysis.config import load_config
    from ecdysis.models import ScriptedModel
    from ecdysis.workspace import Workspace

    with tempfile.TemporaryDirectory() as tmp:
        path = tasks_file(Path(tmp), episodes)
        cfg = load_config(None, ['env.name="jsonl"', f'env.options.path="{path}"', "run.progress=false",
                                 f'run.run_dir="{tmp}/run"', "cache.enabled=false", f"run.concurrency={concurrency}",
                                 'agent.model="scripted:Answer: 1"'])
        ws = Workspace.open(cfg)
        ws.backends["agent|scripted:Answer: 1"] = ScriptedModel(["Answer: 1"], name="instant")
        runner = ws.runner("sandbox-rate")
        tasks = ws.tasks("test", None)
        await runner.evaluate(ws.harness(), tasks[:2], 1, "test", "warm-up")  # the zygote starts once per process
        start = time.perf_counter()
        summary = await runner.evaluate(ws.harness(), tasks, 1, "test", "measure")
        wall = time.perf_counter() - start
        ws.close()
    return {"episode_s": round(wall / summary.episodes, 4), "episodes": summary.episodes, "concurrency": concurrency}


async def check_eval(tasks_path: str, grader: str, name: str, n: int, concurrency: int) -> dict[str, object]:
    """A cold evaluation: real wall time beside charged time (its calls + its episodes' sandbox charge)."""
    from ecdysis.config import load_config
    from ecdysis.models.charge import rates
    from ecdysis.workspace import Workspace

    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(None, ['env.name="jsonl"', f'env.options.path="{Path(tasks_path).resolve()}"',
                                 f'env.options.grader="{grader}"', "run.progress=false", f'run.run_dir="{tmp}/run"',
                                 f'cache.path="{tmp}/cache.sqlite"', f"run.concurrency={concurrency}",
                                 f'agent.model="local:{name}"'])
        ws = Workspace.open(cfg)
        runner = ws.runner("check")
        tasks = ws.tasks("test", n)
        start = time.perf_counter()
        summary = await runner.evaluate(ws.harness(), tasks, 1, "test", "check")
        wall = time.perf_counter() - start
        charged = ws.store.charged_calls("check", [summary.eval_id]) + summary.episodes * rates().episode_s
        ws.close()
    return {"tasks": len(tasks), "episodes": summary.episodes, "wall_s": round(wall, 1),
            "charged_s": round(charged, 1), "ratio_wall_over_charged": round(wall / charged, 3) if charged else None,
            "model_time_s": round(summary.model_time_s, 1), "accuracy": summary.accuracy}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b", help="catalog name or path to a .gguf")
    parser.add_argument("--prompts", default="64,256,512", help="prompt sizes (tokens, about)")
    parser.add_argument("--gens", default="1,32,96", help="generation lengths (max tokens)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--sandbox", action="store_true", help="measure the sandbox's per-episode cost instead")
    parser.add_argument("--episodes", type=int, default=24)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--check", metavar="TASKS.jsonl", help="a cold evaluation: its wall time beside its charge")
    parser.add_argument("--grader", default="normalized")
    parser.add_argument("--tasks", type=int, default=8)
    args = parser.parse_args()
    note = load_note()
    print(f"# machine: {note}")
    if args.check:
        print(json.dumps(asyncio.run(check_eval(args.check, args.grader, args.model, args.tasks, args.concurrency))))
    elif args.sandbox:
        result = asyncio.run(measure_sandbox(args.episodes, args.concurrency))
        print(json.dumps(result))
        print(f'[sandbox]\nepisode_s = {result["episode_s"]}  # {note}')
    else:
        result = asyncio.run(measure_model(args.model, [int(x) for x in args.prompts.split(",")],
                                           [int(x) for x in args.gens.split(",")], args.repeats))
        print(json.dumps(result))
        print(f'[models."{args.model}"]\nprompt_tok_s = {result["prompt_tok_s"]}\ngen_tok_s = {result["gen_tok_s"]}\n'
              f'call_s = {result["call_s"]}\nmeasured = "benchmarks/measure_rates.py, {note}"')


if __name__ == "__main__":
    main()
