"""Sandbox cost per episode: a trivial single-turn episode, with and without bubblewrap.

    .venv/bin/python benchmarks/sandbox_startup.py [--episodes 20]

Runs the episodes one at a time (scripted model, so the time is all sandbox: process start, imports,
confinement, the JSON channel) and alternates the two modes so machine noise hits both alike.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from ecdysis.envs.base import Task
from ecdysis.harness.generic_seed import generic_seed
from ecdysis.runner import confine
from ecdysis.runner.sandbox import SandboxLimits, run_in_sandbox


async def chat(messages: list, params: dict) -> dict:
    return {"text": "Answer: 1", "usage": {"prompt_tokens": 1, "completion_tokens": 1}, "latency_s": 0.0}


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=int, default=20)
    args = parser.parse_args()
    harness = generic_seed("gsm8k", object())
    task = Task(id="t", split="test", prompt="What is 0 + 1?", gold=1)
    exe = confine.bwrap_path()
    times: dict[str, list[float]] = {"bwrap": [], "in-process only": []}
    isolation: dict[str, str] = {}
    probe = confine.bwrap_path
    for i in range(args.episodes * 2):
        mode = "bwrap" if i % 2 == 0 else "in-process only"
        confine.bwrap_path = probe if mode == "bwrap" else (lambda: None)  # type: ignore[assignment]
        start = time.perf_counter()
        traj = await run_in_sandbox(harness, "gsm8k", {}, task, 0, chat, SandboxLimits())
        times[mode].append(time.perf_counter() - start)
        isolation[mode] = traj.isolation
    confine.bwrap_path = probe  # type: ignore[assignment]
    print(f"bwrap available: {bool(exe)}; {args.episodes} episodes per mode")
    for mode, values in times.items():
        print(f"{mode:16} median {statistics.median(values) * 1000:6.0f} ms  p90 "
              f"{sorted(values)[int(0.9 * len(values)) - 1] * 1000:6.0f} ms  isolation={isolation[mode]}")


if __name__ == "__main__":
    asyncio.run(main())
