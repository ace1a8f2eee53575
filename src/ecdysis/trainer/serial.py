"""The `serial` baseline (Life-Harness-style per-failure iterative search) on the same plumbing.

Each round collects failures like the trainer; then, for each failed training task in turn, one
diagnose-and-edit call on that single failure, one implementation, a full training re-evaluation,
and accept/revert by the same rule. The same round cap applies, plus `serial_max_edits` in total.
"""

from __future__ import annotations

from typing import Any

from ..harness.manifest import HarnessVersion
from . import records
from .failures import FailureRecord, Pattern, failure_record, suggest_levers
from .fdcr import SpecWriter
from .levers import Measurement, attach
from .records import RoundRecord, SerialEdit
from .spec import HarnessSpec
from .trainer import Trainer


def single_failure_pattern(record: FailureRecord) -> Pattern:
    return Pattern(
        id="P1", name=f"single failure of task {record.task_id}: ended '{record.termination}'",
        signatures=[record.signature], tasks=[record.task_id], support=1, layer=record.layer,
        classification="recurring", reason="serial search treats every failure as its own target",
        facts=record.facts, levers=suggest_levers([record]),
        evidence=[record.evidence()],
    )


class SerialTrainer(Trainer):
    """Per-failure search: one edit attempt and one full re-evaluation per failed task."""

    async def _round(self, r: int, current: HarnessVersion) -> RoundRecord:
        key = f"r{r}"
        summary = await self._evaluate(current, f"{key}/collect")
        trajectories, patterns = await self._grounded_patterns(key, current, summary)
        self.view.round(r, current.id, summary.accuracy, patterns)
        record = RoundRecord(round=r, harness_before=current.id, harness_after=current.id,
                             train_score=summary.accuracy, patterns=len(patterns),
                             recurring=sum(p.classification == "recurring" for p in patterns))
        gold = {t.id: t.gold for t in self.train_tasks}
        failed = sorted({t.task_id for t in trajectories if t.score < self.cfg.train.failure_threshold})
        if not failed:
            return record.model_copy(update={"stop": "no failures left", "reason": "no failures"})
        per_task, base = summary.per_task, current
        for i, task_id in enumerate(failed):
            attempted = [e for _, e in records.load_all(self.store, self.run_id, SerialEdit) if e.attempted]
            if len(attempted) >= self.cfg.train.serial_max_edits:  # a skipped task (now passing) costs nothing
                break
            edit_key = f"{key}/f{i}"
            done = records.load(self.store, self.run_id, SerialEdit, edit_key)
            if done is None:
                done = await self._edit(edit_key, current, per_task, task_id, gold, trajectories,
                                        self.single_turn(current))
                records.put(self.store, self.run_id, edit_key, done)
            record.edits.append(done)
            if done.accepted and done.harness is not None:
                current = self.store.load_version(done.harness)
                per_task = done.per_task
        record.harness_after, record.accepted = current.id, current.id != base.id
        record.reason = f"{sum(e.accepted for e in record.edits)}/{len(record.edits)} edits accepted"
        return record

    async def _edit(self, key: str, current: HarnessVersion, per_task: dict[str, list[float]], task_id: str,
                    gold: dict[str, Any], trajectories: list[Any], single_turn: bool) -> SerialEdit:
        latest = self.store.trajectories(self.runner.eval_id(current, self.train_tasks, self.cfg.train.train_trials,
                                                             "train"))
        failing = [t for t in (latest or trajectories) if t.task_id == task_id and not t.passed]
        if not failing:
            return SerialEdit(task=task_id, attempted=False, reason="passes with the current harness")
        pattern = single_failure_pattern(failure_record(failing[0], gold[task_id]))
        measured = self.store.get_record(self.run_id, "measurements", key.split("/")[0]) or []
        tasks = {t.id: t for t in self.train_tasks}
        (pattern,) = attach([pattern], [Measurement(**{k: v for k, v in m.items() if k != "lever"})
                                        for m in measured], latest or trajectories, tasks)
        writer = SpecWriter(self.store, self.run_id, self.roles, self.cfg.roles)
        outcome = await self._timed(f"{key}/spec", lambda: writer.write(
            key, current, [pattern], 0, debate=False, earlier=self.earlier_edits(task_id)))
        if outcome.spec is None:
            return SerialEdit(task=task_id, reason=outcome.error or "")
        tried = outcome.spec.summary()
        implementer = self.implementer()
        spec = HarnessSpec.model_validate(outcome.spec.model_dump())
        candidate = await self._timed(f"{key}/implement", lambda: implementer.build(
            current, spec, latest or trajectories, single_turn))
        if candidate.version is None:
            return SerialEdit(task=task_id, reason=candidate.error or "", tried=tried)
        self.store.save_version(candidate.version, parent=current.id, note=f"serial {key}")
        chosen, validation, decision, variant = await self._validate(
            key, current, spec, candidate.version, per_task, implementer, latest or trajectories)
        self.view.decision(decision.accepted, f"serial edit for {task_id} ({variant}): {decision.reason}")
        return SerialEdit(task=task_id, accepted=decision.accepted, reason=decision.reason, variant=variant,
                          harness=chosen.id, per_task=validation.per_task, tried=tried)

    def earlier_edits(self, task_id: str) -> str:
        """What earlier rounds tried for this failure and how it ended (like the trainer's `earlier`)."""
        return "\n".join(f"{key}: {e.tried or 'no valid spec'} -> "
                         f"{'accepted' if e.accepted else 'rejected'} ({e.reason[:200]})"
                         for key, e in records.load_all(self.store, self.run_id, SerialEdit)
                         if e.task == task_id and e.attempted)
