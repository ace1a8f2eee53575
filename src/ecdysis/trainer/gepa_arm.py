"""The `gepa` arm: GEPA (the `gepa` package, optional extra `ecdysis[gepa]`) evolving the harness's text layers.

GEPA drives its own loop (`gepa.optimize`); everything it touches is ours. Its adapter's `evaluate` runs the
candidate harness through this run's `Runner` (same sandbox, response cache, accounting and store as every
arm), its reflective dataset is built from our trajectories and their failure facts, and its reflection LM is
the roles' model through our model layer (`MeteredModel`, accounted as role `reflector`). The components are
the text layers: `contract` (H3) and `tips` (H5 always-on tips, one per line). Candidates pass the same static
checks as every edit (no training ids, task text or gold answers) before any agent run. The budget is the
shared `train.budget.agent_executions`: GEPA's `max_metric_calls`, and a stopper on the episodes actually run.
GEPA's val set is our val split (the train split when there is none). Its best candidate is frozen and tested
like every other arm; a curve point (`records.CurvePoint`) is stored after every GEPA iteration. Its time is
charged time like every arm's (trainer/charged.py): the time budget is checked between GEPA's iterations and
before every episode starts; in a compare its runner also reads the seed's shared evaluation (shared_seed.py). A killed
run resumes: GEPA reloads its state from `RUN_DIR/gepa/RUN_ID`, finished evaluations are read from the store.

`gepa.optimize` is synchronous and our runner is async: it runs in a worker thread and every runner, model and
store call is submitted to the event loop (`LoopBridge`), so the store and the models are only used there.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ..config import Config
from ..models.base import GenerationParams
from ..workspace import Workspace
from . import records
from .api import run_id_for
from .budget import Budget, optimizer_spend, training_evaluations, training_spend
from .charged import charged_seconds
from .context import arm_workspace, freeze_and_test, metered_role
from .gepa_adapter import ARM, LoopBridge, ReflectionModel, RunnerAdapter, in_thread, text_components
from .records import CurvePoint
from .result import RunCosts, TrainResult
from .shared_seed import SharedSeed

ROLE = "reflector"
STALL_ITERATIONS = 5  # stop after this many GEPA iterations in a row that ran no agent episode

def gepa_package() -> Any:
    """The `gepa` package, imported on first use (optional extra)."""
    try:
        import gepa
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RuntimeError("the gepa arm needs the `gepa` package: pip install 'ecdysis[gepa]'") from exc
    return gepa


def execution_budget(config: Config, train: int, val: int) -> int:
    """The shared agent-execution budget (`train.budget.agent_executions`); unset, `train.rounds` passes over
    the train and val tasks (about what R rounds of the round-based arms cost)."""
    return config.train.budget.agent_executions or config.train.rounds * (train + val)


@dataclass
class BudgetStopper:
    """Stops GEPA (checked between its iterations) when a shared budget is spent — episodes actually run
    (`train.budget.agent_executions`), optimizer tokens, charged training time — when it stalls (iterations
    that run no episode), or when the loop side is gone. `reason` says which. Training time is charged seconds
    (read from the store on the loop's side)."""

    run: GepaRun
    reflection: ReflectionModel
    budget: int
    reason: str = ""
    _last: int = -1
    _stalled: int = 0

    def spent(self) -> int:
        assert self.run.adapter is not None
        return self.run.executions_before + self.run.adapter.fresh

    def __call__(self, state: Any) -> bool:
        adapter, limits = self.run.adapter, self.run.config.train.budget
        assert adapter is not None
        tokens = self.run.tokens_before + self.reflection.tokens
        if adapter.bridge.closed.is_set():
            self.reason = "stopped"
        elif self.spent() >= self.budget:
            self.reason = f"budget spent ({self.spent()} of {self.budget} agent executions)"
        elif limits.optimizer_tokens is not None and tokens >= limits.optimizer_tokens:
            self.reason = f"budget spent ({tokens} of {limits.optimizer_tokens} optimizer tokens)"
        elif limits.wall_s is not None and (charged := adapter.bridge.call(self.run.charged)) >= limits.wall_s:
            self.reason = f"budget spent ({charged:.0f} of {limits.wall_s:.0f} charged s of training)"
        else:
            self._stalled = self._stalled + 1 if adapter.fresh == self._last else 0
            self._last = adapter.fresh
            if self._stalled >= STALL_ITERATIONS:
                self.reason = f"{STALL_ITERATIONS} iterations in a row ran no agent episode"
        return bool(self.reason)


@dataclass
class CurveRecorder:
    """GEPA callbacks: a CurvePoint after the seed's val evaluation and after every iteration (the current
    harness is GEPA's best candidate on val so far). Writes go through the loop (the store lives there)."""

    adapter: RunnerAdapter
    run: GepaRun
    val_scores: dict[int, float] = field(default_factory=dict)

    def on_candidate_selected(self, event: dict[str, Any]) -> None:
        self.adapter.parent_id = self.adapter.harness_id(event["candidate"])

    def on_valset_evaluated(self, event: dict[str, Any]) -> None:
        self.val_scores[event["candidate_idx"]] = event["average_score"]
        if event["iteration"] == 0:
            self.adapter.bridge.call(lambda: self.run.point(0, self.adapter.harness_id(event["candidate"]),
                                                            event["average_score"], False, only_new=True))

    def on_iteration_end(self, event: dict[str, Any]) -> None:
        state = event["state"]
        scores = list(state.program_full_scores_val_set)
        best = max(range(len(scores)), key=lambda i: scores[i])
        harness = self.adapter.harness_id(state.program_candidates[best])
        self.adapter.bridge.call(lambda: self.run.point(event["iteration"], harness, scores[best],
                                                        bool(event["proposal_accepted"])))


@dataclass
class GepaResult(TrainResult):
    """The gepa arm's result: every arm's fields, and GEPA's own."""

    candidates: int = 0  # candidates in GEPA's pool at the end
    refused: int = 0  # candidates the static checks refused (never run)


class GepaRun:
    """One gepa-arm run: its store rows, timing and curve (`train_gepa` drives it)."""

    def __init__(self, ws: Workspace, config: Config, run_id: str, val_is_train: bool) -> None:
        self.ws, self.config, self.run_id, self.val_is_train = ws, config, run_id, val_is_train
        self.wall_before = float(ws.store.get_record(run_id, "timing", "gepa/optimize") or 0.0)
        self.start = time.perf_counter()
        before = training_spend(ws.store, run_id)
        self.executions_before, self.cached_before = before.run, before.served
        self.tokens_before = optimizer_spend(ws.store, run_id).tokens
        self.adapter: RunnerAdapter | None = None

    def wall(self) -> float:
        return self.wall_before + time.perf_counter() - self.start

    def charged(self) -> float:
        """Charged seconds so far: its training evaluations' calls and episodes, its reflector's calls."""
        replays = self.adapter.runner.replays if self.adapter else 0
        ids = training_evaluations(self.ws.store, self.run_id)
        return charged_seconds(self.ws.store, self.run_id, ids, self.ws.store.episode_count(ids), replays)

    def point(self, step: int, harness_id: str, val: float, accepted: bool, only_new: bool = False) -> None:
        key = f"curve/{step:04d}"  # as the engine keys its points
        if only_new and records.load(self.ws.store, self.run_id, CurvePoint, key) is not None:
            return
        a = self.adapter
        optimizer = optimizer_spend(self.ws.store, self.run_id)
        records.put(self.ws.store, self.run_id, key, CurvePoint(
            arm=ARM, step=step, harness_id=harness_id, val_score=None if self.val_is_train else val,
            train_score=val if self.val_is_train else None, wall_s=self.wall(),
            agent_executions=self.executions_before + (a.fresh if a else 0),
            cached_executions=self.cached_before + (a.cached if a else 0),
            optimizer_calls=optimizer.calls, optimizer_tokens=optimizer.tokens, accepted=accepted,
            charged_s=self.charged()))
        self.ws.store.put_record(self.run_id, "timing", "gepa/optimize", self.wall())

    def reflection_model(self, bridge: LoopBridge) -> ReflectionModel:
        """GEPA's reflection LM: the moderator's model, accounted as role `reflector`."""
        cfg = self.config
        model = metered_role(self.ws, cfg, self.run_id, ROLE, model_of="moderator")
        return ReflectionModel(bridge, model, GenerationParams(temperature=cfg.roles.temperature,
                                                               max_tokens=cfg.roles.spec_max_tokens))


@dataclass
class FileLogger:
    """GEPA's log into its run folder only (its own Logger swaps sys.stdout for the whole process)."""

    path: Path

    def log(self, message: str) -> None:
        with self.path.open("a") as f:
            f.write(message.rstrip("\n") + "\n")


def tips_template() -> str:
    return (resources.files("ecdysis.prompts") / "gepa_tips.md").read_text()


async def train_gepa(config: Config, ws: Workspace, shared_seed: SharedSeed | None = None) -> GepaResult:
    """Optimize the configured harness's text layers with GEPA under the shared budget; freeze and test the
    best candidate. Resumes a killed run of the same config. `shared_seed`: the compare seed's shared seed
    evaluation, whose cache scope its runner also reads (the seed's val episodes are served from it)."""
    gepa = gepa_package()
    from gepa.strategies.instruction_proposal import InstructionProposalSignature

    ws = arm_workspace(ws, config)  # a view of the workspace under this arm's config (the engine's)
    cfg, store = config, ws.store
    seed = ws.harness()
    run_id = store.start_run("train", cfg.model_dump(mode="json") | {"arm": ARM}, run_id=run_id_for(cfg, ARM))
    store.save_version(seed, note="seed")
    train_tasks = ws.tasks("train", cfg.train.train_limit)
    val_tasks = ws.tasks("val", cfg.train.val_limit)
    if not val_tasks:
        store.put_record(run_id, "note", "gepa-val", "no val split: GEPA tracks its candidates on the train split")
    run = GepaRun(ws, cfg, run_id, val_is_train=not val_tasks)
    budget = execution_budget(cfg, len(train_tasks), len(val_tasks or train_tasks))
    bridge = LoopBridge(asyncio.get_running_loop())
    runner = ws.runner(run_id, cache_scope=cfg.cache.training_scope)
    if shared_seed is not None:
        runner = shared_seed.reading(runner)
    adapter = RunnerAdapter(bridge, runner, seed, train_tasks, {t.id for t in val_tasks}, cfg.train.train_trials)
    if (limit := cfg.train.budget.wall_s) is not None:  # no episode starts once the charged time is spent
        adapter.stop = lambda: run.charged() >= limit
    run.adapter = adapter
    reflection = run.reflection_model(bridge)
    stopper = BudgetStopper(run, reflection, budget)
    components = text_components(seed)
    if not components:
        raise ValueError(f"the harness {seed.id} has no text layer (contract or skills) for GEPA to evolve")
    templates = {"contract": InstructionProposalSignature.default_prompt_template, "tips": tips_template()}
    gepa_dir = cfg.run.run_dir / "gepa" / run_id
    gepa_dir.mkdir(parents=True, exist_ok=True)

    def optimize() -> Any:
        return gepa.optimize(
            seed_candidate=components, trainset=train_tasks, valset=val_tasks or None, adapter=adapter,
            reflection_lm=reflection, candidate_selection_strategy="pareto",
            reflection_prompt_template={k: v for k, v in templates.items() if k in components},
            max_metric_calls=budget, stop_callbacks=[stopper], callbacks=[CurveRecorder(adapter, run)],
            run_dir=str(gepa_dir), logger=FileLogger(gepa_dir / "run_log.txt"), seed=cfg.run.seed,
            raise_on_exception=False, track_best_outputs=False,
            display_progress_bar=False)

    result = await in_thread(optimize, bridge)
    store.put_record(run_id, "timing", "gepa/optimize", run.wall())
    final = store.load_version(adapter.harness_id(result.candidates[result.best_idx]))
    frozen, test_before, test_after = await freeze_and_test(ws, cfg, run_id, seed, final)
    spent = training_spend(store, run_id)
    scores = result.val_aggregate_scores
    curve = sorted((p for _, p in records.load_all(store, run_id, CurvePoint)), key=lambda p: p.step)
    out = GepaResult(
        run_id=run_id, arm=ARM, seed_harness_id=seed.id, final_harness_id=final.id, frozen_dir=frozen,
        stop_reason=stopper.reason or "GEPA's metric-call budget spent",
        val_before=scores[0] if val_tasks else None, val_after=scores[result.best_idx] if val_tasks else None,
        test_before=test_before, test_after=test_after,
        wall_s=float(store.get_record(run_id, "timing", "gepa/optimize") or 0.0), charged_s=run.charged(),
        agent_executions=spent.run, cached_executions=spent.served,
        budget=Budget(budget, cfg.train.budget.optimizer_tokens, cfg.train.budget.wall_s), curve=curve,
        candidates=len(result.candidates), refused=adapter.rejected, **RunCosts.of_run(store, run_id).as_kwargs())
    store.finish_run(run_id, out.to_dict())
    return out
