"""`train(config)`: the Python API behind `ecdysis train`."""

from __future__ import annotations

import asyncio
import hashlib

from rich.console import Console

from ..config import Config, identity_json
from ..workspace import Workspace
from .trainer import Trainer, TrainResult
from .view import TrainView

ARMS_WITH_TRAINER = ("ecdysis", "aggregate", "serial")


def config_key(config: Config, suffix: str = "", length: int = 10) -> str:
    """A stable hash of the config (display, execution and location settings excluded: `identity_json`) plus
    `suffix`; the same where the project folder lives."""
    text = identity_json(config) + suffix
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def run_id_for(config: Config, arm: str) -> str:
    """Stable per config and arm, so re-running the same config resumes the same run."""
    return f"train-{arm}-{config_key(config, arm)}"


async def train_async(config: Config, arm: str = "ecdysis", console: Console | None = None,
                      ws: Workspace | None = None) -> TrainResult:
    if arm not in ARMS_WITH_TRAINER:
        raise ValueError(f"arm {arm!r} is not a trainer arm; use one of {ARMS_WITH_TRAINER}")
    ws = ws or Workspace.open(config)
    seed = ws.harness()
    run_id = ws.store.start_run("train", config.model_dump(mode="json") | {"arm": arm}, run_id=run_id_for(config, arm))
    from .serial import SerialTrainer

    trainer_class = SerialTrainer if arm == "serial" else Trainer
    trainer = trainer_class(ws, run_id, arm, TrainView(console, enabled=console is not None))
    final, rounds, stop = await trainer.train(seed)
    executions = ws.store.count_trajectories(run_id, "train") + ws.store.count_trajectories(run_id, "val")
    frozen, test_before, test_after = await trainer.freeze_and_test(seed, final)
    val_before, val_after = await trainer.val_scores(seed, final)
    timings = dict(ws.store.records(run_id, "timing"))
    calls = {row["role"]: row for row in ws.store.call_totals(run_id)}
    optimizer = [row for role, row in calls.items() if role not in ("agent", "user")]  # the user is the env
    agent_tokens = calls.get("agent", {}).get("prompt_tokens", 0) or 0
    agent_tokens += calls.get("agent", {}).get("completion_tokens", 0) or 0
    result = TrainResult(
        run_id=run_id, arm=arm, seed_harness_id=seed.id, final_harness_id=final.id, frozen_dir=frozen,
        rounds=rounds, stop_reason=stop,
        train_before=rounds[0].train_score if rounds else 0.0,
        train_after=_train_after(ws, trainer, final), val_before=val_before, val_after=val_after,
        accept_rule=trainer.accept_rule,
        test_before=test_before, test_after=test_after,
        wall_s=sum(v for k, v in timings.items() if k.startswith("r")),  # training only, not val/test reporting
        agent_executions=executions,
        optimizer_calls=sum(row["calls"] for row in optimizer),
        optimizer_tokens=sum((row["prompt_tokens"] or 0) + (row["completion_tokens"] or 0) for row in optimizer),
        agent_tokens=agent_tokens, timings=timings,
        prompt_cache={role: (row["prompt_tokens"] or 0, row["cached_tokens"] or 0) for role, row in calls.items()},
    )
    ws.store.finish_run(run_id, result.to_dict())
    return result


def _train_after(ws: Workspace, trainer: Trainer, final: object) -> float:
    """Train score of the final harness, read from its recorded train evaluation."""
    eval_id = trainer.runner.eval_id(final, trainer.train_tasks, ws.config.train.train_trials, "train")  # type: ignore[arg-type]
    trajectories = ws.store.trajectories(eval_id)
    return sum(t.score for t in trajectories) / len(trajectories) if trajectories else 0.0


def train(config: Config, arm: str = "ecdysis", console: Console | None = None) -> TrainResult:
    """Train a harness from `config` (resuming a previous run of the same config) and return the result."""
    return asyncio.run(train_async(config, arm, console))
