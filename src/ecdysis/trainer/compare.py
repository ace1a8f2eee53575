"""`ecdysis compare`: every arm on the same tasks, models, cache and store, with ratios from recorded numbers.

Arms: direct (bare harness), fixed (seed, never changed), serial (per-failure search), aggregate
(aggregation + one analyst), ecdysis (aggregation + FDCR), best-of-k (the fixed harness sampled k
times per test task, majority vote without gold; k matches the ecdysis arm's agent token spend).
"""

from __future__ import annotations

import csv
import json
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..config import Config
from ..harness.manifest import HarnessVersion, set_manifest_value, version_from_files
from ..runner.runner import EvalSummary
from ..workspace import Workspace
from .api import ARMS_WITH_TRAINER, config_key, train_async

ARMS = ("direct", "fixed", "serial", "aggregate", "ecdysis", "best-of-k")
BEST_OF_K_MAX = 8
BEST_OF_K_TEMPERATURE = 0.7


@dataclass
class ArmResult:
    arm: str
    seed: int
    train_wall_s: float = 0.0
    agent_executions: int = 0
    optimizer_calls: int = 0
    optimizer_tokens: int = 0
    agent_tokens: int = 0
    accepted_edits: int = 0
    rejected_edits: int = 0
    train_acc: float = 0.0
    val_acc: float | None = None
    test_acc: float = 0.0
    pass_at_k: float = 0.0
    pass_hat_k: float = 0.0
    gap: float = 0.0
    k: int = 1
    harness_id: str = ""
    transfer_acc: float | None = None
    speedup_vs_serial: float | None = None
    executions_ratio_vs_serial: float | None = None
    test_gain_vs_fixed: float | None = None  # relative: test / fixed test - 1
    test_delta_vs_fixed: float | None = None  # absolute: test - fixed test (defined when fixed scores 0)
    test_gain_vs_serial: float | None = None
    prefix_cache_rate: float | None = None  # prompt tokens the backends served from their prefix cache (training)


def bare_harness(env: str) -> HarnessVersion:
    """The `direct` arm: no contract, skills, demos, validation or regulation; the reply is the answer."""
    manifest = (f'name = "direct"\nenv = "{env}"\n\n[budget]\nmax_turns = 1\nmax_rejections = 0\n\n'
                '[files]\ncontract = ""\nskills = ""\ndemos = ""\naction = ""\nregulate = ""\n')
    return version_from_files({"harness.toml": manifest}, origin="direct")


def majority_vote_accuracy(ws: Workspace, summary: EvalSummary, tasks: dict[str, Any]) -> float:
    """Select one outcome per task by majority over (answer, final state); no gold is used to select."""
    by_task: dict[str, list[Any]] = {}
    for t in ws.store.trajectories(summary.eval_id):
        by_task.setdefault(t.task_id, []).append(t)
    correct = 0
    for task_id, trajs in by_task.items():
        votes = Counter((t.final_answer, json.dumps(t.final_state, sort_keys=True)) for t in trajs
                        if t.final_answer is not None or t.final_state)
        if not votes:
            continue
        (answer, state), _ = votes.most_common(1)[0]
        correct += ws.env.grade(tasks[task_id], answer, json.loads(state)).passed
    return correct / len(by_task) if by_task else 0.0


async def _evaluate_fixed(ws: Workspace, version: HarnessVersion, run_id: str) -> tuple[EvalSummary, EvalSummary]:
    runner = ws.runner(run_id)
    cfg = ws.config
    start = time.perf_counter()
    train = await runner.evaluate(version, ws.tasks("train", cfg.train.train_limit), cfg.train.train_trials,
                                  "train", "train")
    ws.store.put_record(run_id, "timing", "train", time.perf_counter() - start)
    test = await runner.evaluate(version, ws.tasks("test", cfg.train.test_limit), cfg.eval.trials, "test", "test")
    return train, test


async def run_arm(ws: Workspace, arm: str, seed: int, ecdysis_tokens: int | None = None,
                  transfer_model: str | None = None) -> tuple[ArmResult, HarnessVersion]:
    cfg = ws.config
    if arm in ARMS_WITH_TRAINER:
        arm_cfg = cfg.model_copy(deep=True)
        if cfg.cache.isolate_arms:
            # per arm, seed and config: a rerun of the same compare resumes from its own cache entries,
            # another config (or code that changed the prompts) pays for its training again
            arm_cfg.cache.training_scope = f"{arm}/seed{seed}/{config_key(cfg, length=8)}"
        ws.config = arm_cfg
        try:
            result = await train_async(arm_cfg, arm, ws=ws)
        finally:
            ws.config = cfg
        edits = [e for r in result.rounds for e in r.attempts()]
        accepted = sum(e.accepted for e in edits)
        test = result.test_after or {}
        out = ArmResult(arm, seed, result.wall_s, result.agent_executions, result.optimizer_calls,
                        result.optimizer_tokens, result.agent_tokens, accepted, len(edits) - accepted,
                        result.train_after, test.get("accuracy", 0.0), test.get("pass_at_k", 0.0),
                        test.get("pass_hat_k", 0.0), harness_id=result.final_harness_id)
        out.val_acc = result.val_after
        sent = sum(p for p, _ in result.prompt_cache.values())
        out.prefix_cache_rate = sum(c for _, c in result.prompt_cache.values()) / sent if sent else None
        version = ws.store.load_version(result.final_harness_id)
    else:
        run_id = ws.store.start_run("compare-arm", {"arm": arm, "seed": seed},
                                    run_id=f"{arm}-seed{seed}-{config_key(cfg, length=8)}")
        version = bare_harness(cfg.env.name) if arm == "direct" else ws.harness()
        if arm == "best-of-k":
            fixed_test = ws.tasks("test", cfg.train.test_limit)
            probe = await ws.runner(run_id).evaluate(version, fixed_test, 1, "test", "test-probe")
            per_trial = max(probe.prompt_tokens + probe.completion_tokens, 1)
            k = max(1, min(BEST_OF_K_MAX, math.floor((ecdysis_tokens or per_trial) / per_trial)))
            sampled = version.with_files({"harness.toml": set_manifest_value(
                version.files["harness.toml"], "generation", "temperature", BEST_OF_K_TEMPERATURE)})
            if ecdysis_tokens is None:
                ws.store.put_record(run_id, "note", "best-of-k", "no ecdysis arm ran before best-of-k: k is set "
                                    "from one probe pass of the fixed harness (k = 1), not from a matched budget")
            summary = await ws.runner(run_id).evaluate(sampled, fixed_test, k, "test", "test")
            acc = majority_vote_accuracy(ws, summary, {t.id: t for t in fixed_test})
            out = ArmResult(arm, seed, agent_executions=0,
                            agent_tokens=summary.prompt_tokens + summary.completion_tokens,
                            test_acc=acc, pass_at_k=summary.pass_at_k, pass_hat_k=summary.pass_hat_k, k=k,
                            harness_id=sampled.id)
        else:
            train, test = await _evaluate_fixed(ws, version, run_id)
            out = ArmResult(arm, seed, agent_executions=0,
                            agent_tokens=test.prompt_tokens + test.completion_tokens + train.prompt_tokens
                            + train.completion_tokens, train_acc=train.accuracy, test_acc=test.accuracy,
                            pass_at_k=test.pass_at_k, pass_hat_k=test.pass_hat_k, harness_id=version.id)
    out.gap = out.train_acc - out.test_acc if arm != "best-of-k" else 0.0
    if transfer_model:
        runner = ws.runner(f"transfer-{arm}-seed{seed}", model_ref=transfer_model)
        ws.store.start_run("transfer", {"arm": arm, "model": transfer_model}, run_id=f"transfer-{arm}-seed{seed}")
        summary = await runner.evaluate(version, ws.tasks("test", cfg.train.test_limit), 1, "test", "transfer")
        out.transfer_acc = summary.accuracy
    return out, version


def add_ratios(results: list[ArmResult]) -> None:
    """Ratios against `serial` (speed-up) and `fixed` (gain), per seed, from the recorded numbers."""
    for r in results:
        peers = {p.arm: p for p in results if p.seed == r.seed}
        serial, fixed = peers.get("serial"), peers.get("fixed")
        if serial and r.train_wall_s > 0 and r.arm not in ("fixed", "direct", "best-of-k"):
            r.speedup_vs_serial = serial.train_wall_s / r.train_wall_s
            r.executions_ratio_vs_serial = serial.agent_executions / max(r.agent_executions, 1)
        if fixed:
            r.test_delta_vs_fixed = r.test_acc - fixed.test_acc
        if fixed and fixed.test_acc > 0:
            r.test_gain_vs_fixed = r.test_acc / fixed.test_acc - 1
        if serial and serial.test_acc > 0:
            r.test_gain_vs_serial = r.test_acc / serial.test_acc - 1


def write_results(results: list[ArmResult], directory: Path) -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    rows = [asdict(r) for r in results]
    json_path, csv_path = directory / "compare.json", directory / "compare.csv"
    json_path.write_text(json.dumps(rows, indent=1))
    with csv_path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return json_path, csv_path


async def compare(config: Config, arms: list[str], seeds: int = 1, transfer_model: str | None = None,
                  open_workspace: Callable[[Config], Workspace] = Workspace.open) -> list[ArmResult]:
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        raise ValueError(f"unknown arm(s) {unknown}; known: {', '.join(ARMS)}")
    ordered = [a for a in ARMS if a in arms]
    if "best-of-k" in ordered and "ecdysis" in ordered:  # best-of-k's k needs the ecdysis arm's spend
        ordered.remove("best-of-k")
        ordered.append("best-of-k")
    results: list[ArmResult] = []
    for seed in range(seeds):
        cfg = config.model_copy(deep=True)
        cfg.run.seed = config.run.seed + seed
        ws = open_workspace(cfg)
        spend: int | None = None
        for arm in ordered:
            result, _ = await run_arm(ws, arm, cfg.run.seed, spend, transfer_model)
            if arm == "ecdysis":
                spend = result.agent_tokens
            results.append(result)
            ws.store.put_record("compare", "arm", f"{arm}/seed{cfg.run.seed}", asdict(result))
        ws.close()
    add_ratios(results)
    return results
