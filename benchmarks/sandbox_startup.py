"""Sandbox cost per episode: a trivial single-turn episode forked from the zygote, in a fresh bubblewrap
worker process, and in a fresh process with in-process measures only.

    .venv/bin/python benchmarks/sandbox_startup.py [--episodes 20] [--env gsm8k|tau2-mock]

Runs the episodes one at a time (scripted model, so the time is all sandbox: fork or process start,
imports, confinement, the JSON channel) and rotates the modes so machine noise hits all alike. The forked
mode is what the runner uses where nested namespaces work (its next fork is made while an episode runs,
as in an evaluation). "busy CPU" is the whole machine's (host, worker, kernel) per episode. With
`--env tau2-mock` each episode is a conversation (the scripted user ends it at once) in τ²'s mock domain,
whose imports the zygote does once (`preload_sandbox`).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from ecdysis.envs import get_environment, seeded_order
from ecdysis.harness.generic_seed import generic_seed
from ecdysis.sandbox import confine
from ecdysis.sandbox.host import SandboxLimits, run_in_sandbox
from ecdysis.sandbox.view import SandboxView
from ecdysis.sandbox.workers import WorkerPool

MODES = ("forked (zygote)", "fresh bwrap", "in-process only")


def busy_cpu_s() -> float:
    fields = [int(v) for v in open("/proc/stat").readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / 100  # everything but idle and iowait, in seconds


async def chat(messages: list, params: dict) -> dict:
    return {"text": "Answer: 1", "usage": {"prompt_tokens": 1, "completion_tokens": 1}, "latency_s": 0.0}


async def user(conversation: list) -> dict:
    return {"text": "###STOP###", "stop": True}


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--env", default="gsm8k", choices=["gsm8k", "tau2-mock"])
    args = parser.parse_args()
    env = get_environment(args.env)
    harness = generic_seed(args.env, env)
    task = seeded_order(env.tasks("test"), 0)[0]
    view = SandboxView(hidden=tuple(getattr(env, "sandbox_hidden", ())))
    conversation = user if getattr(env, "conversational", False) else None
    exe = confine.bwrap_path()
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    cpu: dict[str, list[float]] = {mode: [] for mode in MODES}
    isolation: dict[str, str] = {}
    probe = confine.bwrap_path
    pool = WorkerPool()
    await run_in_sandbox(harness, args.env, {}, task, 0, chat, SandboxLimits(), user=conversation, view=view,
                         pool=pool)  # the zygote starts
    for i in range(args.episodes * len(MODES)):
        mode = MODES[i % len(MODES)]
        confine.bwrap_path = probe if mode != "in-process only" else (lambda: None)  # type: ignore[assignment]
        await asyncio.sleep(0.05)  # as between an evaluation's model calls: the next fork is made meanwhile
        start, busy = time.perf_counter(), busy_cpu_s()
        traj = await run_in_sandbox(harness, args.env, {}, task, 0, chat, SandboxLimits(), user=conversation,
                                    view=view, pool=pool if mode == MODES[0] else None)
        times[mode].append(time.perf_counter() - start)
        cpu[mode].append(busy_cpu_s() - busy)
        isolation[mode] = traj.isolation
    confine.bwrap_path = probe  # type: ignore[assignment]
    pool.close()
    print(f"{args.env}; bwrap available: {bool(exe)}; {args.episodes} episodes per mode")
    for mode in MODES:
        values = times[mode]
        print(f"{mode:16} median {statistics.median(values) * 1000:6.1f} ms  p90 "
              f"{sorted(values)[int(0.9 * len(values)) - 1] * 1000:6.1f} ms  busy CPU "
              f"{statistics.mean(cpu[mode]) * 1000:6.1f} ms  isolation={isolation[mode]}")


if __name__ == "__main__":
    asyncio.run(main())
