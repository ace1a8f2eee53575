"""Training evaluations: one harness on one split, in fixed batches, within the budget, completed or said why not.

The tasks of a split are cut into fixed batches (the acceptance split when `train.engine.early_stop`:
`train.engine.eval_batch` tasks, default 4 x `run.concurrency`; the train split: `train.engine.screen_batch`
tasks when screening is on; otherwise one batch), and
each batch is one runner evaluation with a stable id, so a stopped evaluation is resumed or completed later
by running only its missing batches, and the same harness on the same split always reuses what ran.
Between batches the evaluation stops when the budget is spent or when a `stop` predicate (early-stopped
validation) says the outcome is decided. Episodes the infrastructure lost are run once more; what is
still missing after that is named in `Measured.stopped`.

An evaluation on which the grader failed (a grader error on any episode) raises `GraderFailed` before anything
is decided or diagnosed from it; once the grader is fixed, the same command grades the stored episodes again.

Every training evaluation is registered in the run store (kind `spend`) before it runs; the run's agent
executions are recounted from the registered evaluations' stored episodes, so a killed run resumes with
the right spend and episodes run before the kill are charged once. Within a batch no episode starts once the
budget is spent (its charged time included). A harness with a shared evaluation (the compare seed's seed
harness, `shared_seed.py`) is evaluated by that runner; its stored batches are registered and charged here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..agent.trajectory import INFRA_ERROR, Trajectory
from ..envs.base import Task
from ..harness.manifest import HarnessVersion
from ..runner.failures import GraderFailed, count_failures
from ..runner.runner import Runner, regrade_grader_errors
from ..store.db import RunStore
from .budget import Budget, Spend

Stop = Callable[[dict[str, list[float]]], str | None]


@dataclass
class Measured:
    """Scores of one harness on one split, over the tasks that ran (`expected`: all the split's tasks)."""

    harness_id: str
    split: str
    expected: list[str]
    trials: int
    per_task: dict[str, list[float]] = field(default_factory=dict)
    eval_ids: list[str] = field(default_factory=list)
    stopped: str | None = None  # why the evaluation is incomplete (budget, decided early, infrastructure)

    @property
    def complete(self) -> bool:
        return all(len(self.per_task.get(t, [])) >= self.trials for t in self.expected)

    @property
    def missing(self) -> list[str]:
        return [t for t in self.expected if len(self.per_task.get(t, [])) < self.trials]

    @property
    def score(self) -> float | None:
        """Mean over the tasks that ran of each task's mean score; None when nothing ran."""
        values = [sum(v) / len(v) for v in self.per_task.values() if v]
        return sum(values) / len(values) if values else None

    def failing(self, threshold: float) -> list[str]:
        return sorted(t for t, v in self.per_task.items() if any(s < threshold for s in v))


def fresh(t: Trajectory) -> bool:
    """An episode that made at least one uncached model call (or none at all): it was actually run."""
    return t.model_calls == 0 or t.cache_hits < t.model_calls


class Evaluator:
    """Runs training evaluations for one run, charging the budget."""

    def __init__(self, store: RunStore, run_id: str, runner: Runner, tasks: dict[str, list[Task]], trials: int,
                 batches: dict[str, int], budget: Budget, spend: Callable[[], Spend]) -> None:
        self.store, self.run_id, self.runner, self.tasks, self.trials = store, run_id, runner, tasks, trials
        self.batches, self.budget, self.spend = batches, budget, spend
        self.shared: dict[str, Runner] = {}  # harness id -> the runner of a shared evaluation (shared_seed.py)
        self.ledger: dict[str, tuple[int, int]] = {}
        for eval_id, _ in store.records(run_id, "spend"):
            self._count(eval_id)

    def _count(self, eval_id: str) -> None:
        done = [t for t in self.store.trajectories(eval_id) if t.termination != INFRA_ERROR]
        run = sum(fresh(t) for t in done)
        self.ledger[eval_id] = (run, len(done) - run)

    def runner_for(self, version: HarnessVersion) -> Runner:
        return self.shared.get(version.id, self.runner)

    def spent(self) -> str | None:
        """The budget's stop reason, when it is spent."""
        return self.budget.exhausted(self.spend())

    def executions(self) -> tuple[int, int]:
        """(episodes actually run, cache-served episodes) over every training evaluation of the run."""
        return sum(r for r, _ in self.ledger.values()), sum(c for _, c in self.ledger.values())

    def chunks(self, split: str) -> list[list[Task]]:
        tasks = self.tasks[split]
        size = self.batches.get(split) or len(tasks) or 1
        return [tasks[i:i + size] for i in range(0, len(tasks), size)]

    def _fit(self, chunk: list[Task], done: set[tuple[str, int]], left: int | None) -> list[Task]:
        """The longest prefix of `chunk` whose episodes still to run fit in `left` executions."""
        if left is None:
            return chunk
        out, need = [], 0
        for task in chunk:
            need += sum((task.id, k) not in done for k in range(self.trials))
            if need > left:
                break
            out.append(task)
        return out

    def lookup(self, version: HarnessVersion, split: str) -> Measured:
        """What is stored for this harness on this split (full batches only), running nothing."""
        out = Measured(version.id, split, [t.id for t in self.tasks[split]], self.trials)
        for chunk in self.chunks(split):
            eval_id = self.runner_for(version).eval_id(version, chunk, self.trials, split)
            out.eval_ids.append(eval_id)
            self._merge(out, self.store.trajectories(eval_id))
        return out

    @staticmethod
    def _merge(out: Measured, trajectories: list[Trajectory]) -> None:
        for t in trajectories:
            if t.termination != INFRA_ERROR:
                out.per_task.setdefault(t.task_id, []).append(t.score)

    async def measure(self, version: HarnessVersion, split: str, stop: Stop | None = None,
                      charge: bool = True, max_batches: int | None = None) -> Measured:
        """Evaluate batch by batch; stop early when `stop(per_task)` returns a reason, when the budget is spent
        or after `max_batches`. Lost episodes are run once more. `charge=False` (reporting evaluations):
        no budget, nothing charged."""
        out = Measured(version.id, split, [t.id for t in self.tasks[split]], self.trials)
        chunks = self.chunks(split)[:max_batches] if max_batches else self.chunks(split)
        episodes: list[Trajectory] = []  # every stored episode of the batches measured (grader errors refused)
        for attempt in range(2):
            out.per_task, out.eval_ids, out.stopped, episodes = {}, [], None, []
            for chunk in chunks:
                if out.stopped is None and stop is not None and out.per_task and (why := stop(out.per_task)):
                    out.stopped = why
                ran = await self._batch(version, chunk, split, out.stopped is None, charge)
                if ran is None:
                    out.stopped = out.stopped or self.budget.exhausted(self.spend()) or "budget spent"
                    continue
                eval_id, trajectories = ran
                out.eval_ids.append(eval_id)
                episodes += trajectories
                self._merge(out, trajectories)
                short = any(len(out.per_task.get(t.id, [])) < self.trials for t in chunk)
                if out.stopped is None and charge and short and (spent := self.spent()):
                    out.stopped = spent  # the budget ran out inside this batch: no new episode started
            if out.stopped is not None or out.complete or attempt == 1:
                break
        ran_ids = {task.id for c in chunks for task in c}
        lost = [t for t in out.missing if t in ran_ids]
        tokens = self.runner.max_agent_tokens
        if out.stopped is None and lost and tokens is not None and self.runner.tokens_spent >= tokens:
            out.stopped = f"run.max_agent_tokens ({tokens}) spent: {len(lost)} task(s) not run"
        elif out.stopped is None and lost:
            out.stopped = f"{len(lost)} task(s) lost by the infrastructure twice: {', '.join(lost[:5])}"
        if out.stopped is None and max_batches and not out.complete:
            out.stopped = f"screened on {len(ran_ids)} of {len(out.expected)} task(s)"
        if (failures := count_failures(episodes)).grader_errors:
            raise GraderFailed(split, len(episodes), failures)
        return out

    async def _batch(self, version: HarnessVersion, chunk: list[Task], split: str, run: bool,
                     charge: bool) -> tuple[str, list[Trajectory]] | None:
        """One batch: what is stored, plus (when `run`) the episodes the budget allows. None: nothing stored
        and nothing may run."""
        runner = self.runner_for(version)
        eval_id = runner.eval_id(version, chunk, self.trials, split)
        regrade_grader_errors(self.store, runner.env, eval_id, chunk)  # the grader may have been fixed
        done = self.store.done_keys(eval_id)
        if len(done) >= len(chunk) * self.trials:
            if charge and eval_id not in self.ledger:  # a shared evaluation another arm ran: charged here too
                self.store.put_record(self.run_id, "spend", eval_id, {"harness": version.id, "split": split})
                self._count(eval_id)
            return eval_id, self.store.trajectories(eval_id)
        if run and not charge:
            summary = await runner.evaluate(version, chunk, self.trials, split, split)
            return summary.eval_id, self.store.trajectories(summary.eval_id)
        spend = self.spend()
        fitted = self._fit(chunk, done, self.budget.executions_left(spend)) if run else []
        if not fitted or self.budget.exhausted(spend):
            return (eval_id, self.store.trajectories(eval_id)) if done else None
        if len(fitted) < len(chunk):  # the budget's last episodes: a smaller batch of its own
            eval_id, chunk = runner.eval_id(version, fitted, self.trials, split), fitted
        self.store.put_record(self.run_id, "spend", eval_id, {"harness": version.id, "split": split})
        self.ledger.setdefault(eval_id, (0, 0))  # its calls count toward the time budget as they are made
        summary = await runner.evaluate(version, chunk, self.trials, split, split,
                                        stop=lambda: self.spent() is not None)
        self._count(summary.eval_id)
        return summary.eval_id, self.store.trajectories(summary.eval_id)
