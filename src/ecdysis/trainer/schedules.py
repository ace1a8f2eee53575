"""A method's schedule: which steps one round of the training loop takes.

- `RoundSchedule` (aggregate, ecdysis): one step per round over the aggregated patterns of the current
  harness's failures; the loop stops after `train.engine.stop_after_rejections` rejected rounds in a row.
- `PerFailureSchedule` (serial, serial+library): one step per failing training task of the *current* harness,
  taken in a seeded random order (targets.py); after an accepted edit the new harness is evaluated on the
  training tasks (the full re-evaluation per accepted edit the baseline pays) and the next target is one of
  its failures (every one of them a new target, an earlier target included). A round ends when every failure of the
  current harness was tried in it; `train.serial_max_edits` caps the attempts over the run.

A schedule drives the loop through `Loop` (the engine): collect evidence, attempt a step, store a curve point.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Protocol

from ..config import Config
from ..envs.base import Task
from ..harness.manifest import HarnessVersion
from ..store.db import RunStore
from . import records
from .budget import Budget, Spend
from .evaluation import Measured
from .proposers.base import Evidence
from .records import DecisionEvidence, RoundRecord, SerialEdit
from .targets import target_order
from .view import TrainView


@dataclass
class StepOutcome:
    """What one step decided."""

    accepted: bool = False
    reason: str = ""
    candidate: str | None = None
    candidate_score: float | None = None
    variant: str | None = None
    variant_scores: dict[str, float | None] = field(default_factory=dict)
    decided_on: str | None = None
    taken: bool = True
    early: bool = False
    library: str | None = None
    tried: str | None = None
    evidence: DecisionEvidence | None = None

    def harness_after(self, current: HarnessVersion) -> str:
        return self.candidate if self.accepted and self.candidate else current.id


class Loop(Protocol):
    """What a schedule uses of the engine."""

    cfg: Config
    store: RunStore
    run_id: str
    train_tasks: list[Task]
    budget: Budget
    view: TrainView

    def spend(self) -> Spend: ...

    async def collect(self, key: str, r: int, current: HarnessVersion) -> Evidence: ...

    async def attempt(self, key: str, ev: Evidence, target: str | None) -> StepOutcome: ...

    def point(self, decision_key: str, current: HarnessVersion, accepted: bool, taken: bool = True) -> None: ...

    def started(self, key: str) -> bool: ...

    def start(self, key: str) -> None: ...


def incomplete(loop: Loop, measured: Measured) -> str:
    return loop.budget.exhausted(loop.spend()) or measured.stopped or "evaluation incomplete"


def round_record(r: int, ev: Evidence) -> RoundRecord:
    return RoundRecord(round=r, harness_before=ev.current.id, harness_after=ev.current.id,
                       train_score=ev.collect.score or 0.0, patterns=len(ev.patterns), recurring=len(ev.recurring))


class Schedule(ABC):
    name: str = ""
    stops_after_rejections: bool = True  # the loop stops after `stop_after_rejections` rejected rounds in a row

    @abstractmethod
    async def round(self, loop: Loop, r: int, current: HarnessVersion) -> RoundRecord:
        """Run round `r` from the `current` harness; its record (stored by the loop)."""


class RoundSchedule(Schedule):
    name = "rounds"

    async def round(self, loop: Loop, r: int, current: HarnessVersion) -> RoundRecord:
        key = f"r{r}"
        ev = await loop.collect(key, r, current)
        loop.view.round(r, current.id, ev.collect.score or 0.0, ev.patterns)
        record = round_record(r, ev)
        if not ev.collect.complete:
            return record.model_copy(update={"stop": incomplete(loop, ev.collect), "reason": "collect incomplete"})
        if not ev.recurring:
            return record.model_copy(update={"stop": "nothing recurring left", "reason": "no recurring pattern"})
        out = await loop.attempt(key, ev, None)
        after = out.harness_after(current)
        loop.point(key, loop.store.load_version(after), out.accepted, out.taken)
        stop = None if out.taken else loop.budget.exhausted(loop.spend())
        return record.model_copy(update={
            "candidate": out.candidate, "candidate_score": out.candidate_score, "variant": out.variant,
            "decided_on": out.decided_on, "accepted": out.accepted, "reason": out.reason, "harness_after": after,
            "library_candidate": out.library, "decision_taken": out.taken, "early_stopped": out.early,
            "variant_scores": out.variant_scores, "stop": stop, "evidence": out.evidence})


class PerFailureSchedule(Schedule):
    name = "per-failure"
    stops_after_rejections = False

    async def round(self, loop: Loop, r: int, current: HarnessVersion) -> RoundRecord:
        key = f"r{r}"
        ev = await loop.collect(key, r, current)
        loop.view.round(r, current.id, ev.collect.score or 0.0, ev.patterns)
        record = round_record(r, ev)
        threshold, cap = loop.cfg.train.failure_threshold, loop.cfg.train.serial_max_edits
        if ev.collect.complete and not ev.collect.failing(threshold):
            return record.model_copy(update={"stop": "no failures left", "reason": "no failures"})
        tried: set[str] = set()
        for i in range(len(loop.train_tasks) + 1):
            edit_key = f"{key}/f{i}"
            done = records.load(loop.store, loop.run_id, SerialEdit, edit_key)
            if done is None:
                attempted = sum(e.attempted for _, e in records.load_all(loop.store, loop.run_id, SerialEdit))
                order = target_order(ev.collect.failing(threshold), loop.cfg.run.seed, ev.key)
                targets = [t for t in order if t not in tried]
                if attempted >= cap:
                    record.stop = f"serial_max_edits ({cap}) reached"
                elif not ev.collect.complete:
                    record.stop = incomplete(loop, ev.collect)
                elif not loop.started(edit_key) and (spent := loop.budget.exhausted(loop.spend())) is not None:
                    record.stop = spent
                if record.stop is not None or not targets:
                    break
                loop.start(edit_key)
                done = await self._edit(loop, edit_key, ev, targets[0])
                records.put(loop.store, loop.run_id, edit_key, done)
            record.edits.append(done)
            tried.add(done.task)
            if done.accepted and done.harness is not None:
                current = loop.store.load_version(done.harness)
                # the per-failure full re-evaluation: the next target is a failure of the new harness
                ev = await loop.collect(f"{key}/f{i + 1}", r, current)
                tried = set()  # a new harness: each of its failures is a new target
            elif not done.decision_taken:
                record.stop = loop.budget.exhausted(loop.spend()) or done.reason
                break
        record.harness_after, record.accepted = current.id, current.id != record.harness_before
        record.reason = f"{sum(e.accepted for e in record.edits)}/{len(record.edits)} edits accepted"
        return record

    @staticmethod
    async def _edit(loop: Loop, key: str, ev: Evidence, task: str) -> SerialEdit:
        out = await loop.attempt(key, ev, task)  # prints the decision of a validated candidate, naming the task
        if out.candidate is None:  # the step ended before any candidate was validated
            loop.view.decision(False, f"serial edit for {task}: {out.reason}")
        loop.point(key, loop.store.load_version(out.harness_after(ev.current)), out.accepted, out.taken)
        return SerialEdit(task=task, accepted=out.accepted, reason=out.reason, variant=out.variant,
                          harness=out.candidate, tried=out.tried, decided_on=out.decided_on,
                          decision_taken=out.taken, early_stopped=out.early, variant_scores=out.variant_scores,
                          evidence=out.evidence)
