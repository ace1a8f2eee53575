"""`train(config)`: the Python API behind `ecdysis train`.

`train_async(config, arm, ws=...)` runs one arm under `config`, which is the arm's own config: the workspace
is only borrowed (store, cache, executor, backends) through a view, never reconfigured, so a caller such
as `compare` gives every arm its config without touching a shared one.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass

from rich.console import Console

from ..config import Config
from ..run_identity import identity_json
from ..runner.failures import GraderFailed
from ..workspace import Workspace
from .engine import Engine
from .methods import DEFAULT_METHOD, Method, method, trainer_methods
from .result import RunCosts, TrainResult
from .shared_seed import SharedSeed
from .view import TrainView


def config_key(config: Config, suffix: str = "", length: int = 10) -> str:
    """A stable hash of the config (display, execution and location settings excluded: `identity_json`) plus
    `suffix`; the same where the project folder lives."""
    text = identity_json(config) + suffix
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def run_id_for(config: Config, arm: str) -> str:
    """Stable per config and arm, so re-running the same config resumes the same run."""
    return f"train-{arm}-{config_key(config, arm)}"


@dataclass(frozen=True)
class Arm:
    """A training method (by name, methods.py) run under its own explicit config (budget included)."""

    name: str
    config: Config

    def method(self) -> Method:
        return method(self.name)


async def train_async(config: Config, arm: str | Arm = DEFAULT_METHOD, console: Console | None = None,
                      ws: Workspace | None = None, shared_seed: SharedSeed | None = None) -> TrainResult:
    """Train one arm under `config` (or `arm.config`), resuming a previous run of the same config.
    `shared_seed`: the seed evaluation this arm shares with the other arms of a compare seed."""
    spec = arm if isinstance(arm, Arm) else Arm(arm, config)
    if spec.name not in trainer_methods():
        raise ValueError(f"arm {spec.name!r} is not a trainer arm; use one of {trainer_methods()}")
    config = spec.config
    ws = ws or Workspace.open(config)
    run_id = ws.store.start_run("train", config.model_dump(mode="json") | {"arm": spec.name},
                                run_id=run_id_for(config, spec.name))
    engine = Engine(ws, run_id, spec.method(), config, TrainView(console, enabled=console is not None),
                    shared_seed)
    seed = engine.ws.harness()
    try:
        final, rounds, stop = await engine.train(seed)
        spend = engine.spend()
        curve = engine.curve()
        checked = await engine.holdout_check(seed, final)
        final = seed if checked is not None and checked.kept == "seed" else final
        frozen, test_before, test_after = await engine.freeze_and_test(seed, final)
        val_before, val_after = await engine.val_scores(seed, final)
    except GraderFailed as exc:  # nothing to learn from a grader's failures: the run says why it stopped
        ws.store.finish_run(run_id, {"arm": spec.name, "stop_reason": f"grader failed: {exc}",
                                     "failures": exc.failures.to_dict()}, status="grader_failed")
        raise
    result = TrainResult(
        run_id=run_id, arm=spec.name, seed_harness_id=seed.id, final_harness_id=final.id, frozen_dir=frozen,
        stop_reason=stop, val_before=val_before, val_after=val_after, test_before=test_before, test_after=test_after,
        wall_s=spend.wall_s, agent_executions=spend.agent_executions, cached_executions=spend.cached_executions,
        budget=engine.budget, curve=curve, rounds=rounds, accept_rule=engine.accept_rule, holdout=checked,
        train_before=curve[0].train_score if curve else None, train_after=engine.score(final, "train"),
        charged_s=spend.charged_s, **RunCosts.of_run(ws.store, run_id).as_kwargs())
    ws.store.finish_run(run_id, result.to_dict())
    return result


def train(config: Config, arm: str | Arm = DEFAULT_METHOD, console: Console | None = None) -> TrainResult:
    """Train a harness from `config` (resuming a previous run of the same config) and return the result."""
    return asyncio.run(train_async(config, arm, console))
