"""Measure a catalog model's charged-time rates (or the sandbox's per-episode cost) and print the rates.toml entry.

    .venv/bin/python benchmarks/measure_rates.py --model qwen2.5-coder-1.5b [--prompts 64,512,1024,2048]
        [--gens 1,48,160] [--repeats 2]
    .venv/bin/python benchmarks/measure_rates.py --sandbox [--episodes 24] [--concurrency 2]
    .venv/bin/python benchmarks/measure_rates.py --check TASKS.jsonl --grader G --model NAME [--tasks 8]
    .venv/bin/python benchmarks/measure_rates.py --validate RUN_DIR --model NAME

Model: every (prompt tokens, generated tokens) pair is sent `repeats` times through the embedded backend exactly
as a run sends it (`LlamaCppModel.chat`: chat template, one call at a time); each prompt starts with a fresh
random word so the context's prefix cache cannot serve it (what it still serves is taken off, as the charge
does). The fit is least squares of latency on the terms of `Rate.seconds` (src/ecdysis/models/charge.py: a cost
per call, per fresh prompt token, per generated token, per token x context pair for each, per token generated
under a JSON grammar: every size is sent free and with a schema), coefficients kept >= 0. Validate: the
table's charge for every fresh call a run recorded with the model (a run made on an idle machine) against its
measured latency, by role. Sandbox: an evaluation of `--episodes` one-line tasks
whose model replies at once (scripted), at the runs' concurrency: wall time per episode. Check: a cold
evaluation (a fresh response cache) of `--tasks` tasks of a suite with the real model, its real wall time
beside its charged time (calls + episodes).
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
                for schema in (None, JSON_SCHEMA) if g > 1 else (None,):  # free text, and under a JSON grammar
                    text = filler(max(p - 20, 1), rng) + ("\nNow describe sandboxes in JSON: a long essay and many "
                                                          "points, never stopping early.")
                    params = GenerationParams(max_tokens=g, temperature=0.0 if schema is None else 0.2,
                                              json_schema=schema, session=f"m{len(rows)}")
                    start = time.perf_counter()
                    response = await model.chat(ChatRequest(messages=[Message(role="user", content=text)],
                                                            params=params))
                    elapsed = time.perf_counter() - start
                    u = response.usage
                    rows.append((u.prompt_tokens, u.cached_tokens, u.completion_tokens, u.constrained_tokens, elapsed))
                    print(f"  prompt {u.prompt_tokens} ({u.cached_tokens} prefix-cached), generated "
                          f"{u.completion_tokens} ({u.constrained_tokens} under a grammar): {elapsed:.2f} s",
                          flush=True)
    return fit(rows)


# what a role's spec call asks for (trainer/fdcr.py): a JSON object under a grammar
JSON_SCHEMA = {"type": "object", "properties": {"essay": {"type": "string"}, "points": {"type": "array",
               "items": {"type": "string"}}}, "required": ["essay", "points"]}


def features(prompt: int, cached: int, gen: int, constrained: int) -> list[float]:
    """The cost model's terms (src/ecdysis/models/charge.py, `Rate.seconds`): 1, fresh prompt tokens, generated
    tokens, prompt and generation (token x context) pairs in millions, tokens generated under a grammar."""
    fresh = max(prompt - cached, 0)
    return [1.0, fresh, gen, fresh * (prompt - fresh + fresh / 2) / 1e6, gen * (prompt + gen / 2) / 1e6,
            min(constrained, gen)]


def fit(rows: list[tuple[int, int, int, int, float]]) -> dict[str, object]:
    """Least squares of latency on the terms, every coefficient >= 0 (a negative one is dropped and the rest
    refitted); the rate entry and the largest relative error over the calls."""
    import numpy as np

    design = np.array([features(p, c, g, k) for p, c, g, k, _ in rows])
    latency = np.array([r[4] for r in rows])
    keep = list(range(design.shape[1]))
    while True:
        coef, *_ = np.linalg.lstsq(design[:, keep], latency, rcond=None)
        if (coef >= 0).all() or len(keep) == 1:
            break
        keep.pop(int(np.argmin(coef)))
    full = np.zeros(design.shape[1])
    full[keep] = np.maximum(coef, 0)
    call_s, per_prompt, per_gen, prompt_ctx, gen_ctx, constrained = (float(x) for x in full)
    error = float(np.max(np.abs(design @ full - latency) / latency))
    return {"prompt_tok_s": round(1 / per_prompt, 1), "gen_tok_s": round(1 / per_gen, 2), "call_s": round(call_s, 3),
            "prompt_ctx_s": round(prompt_ctx, 2), "gen_ctx_s": round(gen_ctx, 2),
            "constrained_s": round(constrained, 4), "calls": len(rows), "max_relative_error": round(error, 3)}


def validate(store_dir: str, name: str) -> dict[str, object]:
    """The rate table's charge for every fresh call a run store recorded with the model, against its latency
    (run the runs on an idle machine): totals by role, and the largest relative error of one call."""
    from ecdysis.models.charge import rates
    from ecdysis.store import RunStore

    rate = rates().models[name]
    store = RunStore(Path(store_dir))
    calls = store.fresh_calls()
    store.close()
    by_role: dict[str, list[float]] = {}
    worst = 0.0
    for c in calls:
        constrained = c.constrained_tokens
        if constrained is None:  # a store from before the grammar flag: the optimizer roles reply in JSON under a
            constrained = 0 if c.role in ("agent", "user") else c.completion_tokens  # schema, the agent in free text
        charged = rate.seconds(c.prompt_tokens, c.cached_tokens, c.completion_tokens, constrained)
        totals = by_role.setdefault(c.role, [0, 0.0, 0.0])
        totals[0] += 1
        totals[1] += charged
        totals[2] += c.latency_s
        worst = max(worst, abs(charged - c.latency_s) / c.latency_s)
    roles = {role: {"calls": n, "charged_s": round(c, 1), "latency_s": round(w, 1), "ratio": round(c / w, 3)}
             for role, (n, c, w) in by_role.items()}
    return {"table": rates().version, "roles": roles, "max_relative_error": round(worst, 3)}


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
    parser.add_argument("--prompts", default="64,512,1024,2048", help="prompt sizes (tokens, about)")
    parser.add_argument("--gens", default="1,48,160", help="generation lengths (max tokens)")
    parser.add_argument("--validate", metavar="RUN_DIR", help="the table's charge of a run's fresh calls vs latency")
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
    if args.validate:
        print(json.dumps(validate(args.validate, args.model), indent=1))
    elif args.check:
        print(json.dumps(asyncio.run(check_eval(args.check, args.grader, args.model, args.tasks, args.concurrency))))
    elif args.sandbox:
        result = asyncio.run(measure_sandbox(args.episodes, args.concurrency))
        print(json.dumps(result))
        print(f'[sandbox]\nepisode_s = {result["episode_s"]}  # {note}')
    else:
        result = asyncio.run(measure_model(args.model, [int(x) for x in args.prompts.split(",")],
                                           [int(x) for x in args.gens.split(",")], args.repeats))
        print(json.dumps(result))
        entry = "\n".join(f"{k} = {result[k]}" for k in ("prompt_tok_s", "gen_tok_s", "call_s", "prompt_ctx_s",
                                                           "gen_ctx_s", "constrained_s"))
        print(f'[models."{args.model}"]\n{entry}\nmeasured = "benchmarks/measure_rates.py, {note}"')


if __name__ == "__main__":
    main()
