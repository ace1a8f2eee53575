"""The `serial` proposer (Life-Harness-style per-failure search): one failure, one diagnose-and-edit call.

Each step targets one failing training task of the *current* harness: after an accepted edit the engine
re-evaluates the new harness on the training tasks (the full re-evaluation per accepted edit the baseline
pays) and the next target is one of the new harness's failures. A round ends when every failure of the
current harness was tried in it; `train.serial_max_edits` caps the attempts over the run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..evidence import Pattern
from ..failures import FailureRecord, failure_record, suggest_levers
from ..fdcr import SpecWriter
from ..levers import attach
from ..records import SerialEdit, load_all
from .base import Evidence, Proposal, Proposer

if TYPE_CHECKING:
    from ..engine import Engine


def single_failure_pattern(record: FailureRecord) -> Pattern:
    return Pattern(
        id="P1", name=f"single failure of task {record.task_id}: ended '{record.termination}'",
        signatures=[record.signature], tasks=[record.task_id], support=1, layer=record.layer,
        classification="recurring", reason="serial search treats every failure as its own target",
        facts=record.facts, levers=suggest_levers([record]),
        evidence=[record.evidence()],
    )


class SerialProposer(Proposer):
    name = "serial"
    per_failure = True
    library_fallback = False  # the baseline as published: no library candidates
    library_variants = False

    def patterns(self, engine: Engine, evidence: Evidence, target: str | None) -> list[Pattern]:
        """The target's failure as its own pattern, with the measured levers of the current harness."""
        assert target is not None
        failing = [t for t in evidence.trajectories if t.task_id == target and not t.passed]
        gold = {t.id: t.gold for t in engine.train_tasks}
        pattern = single_failure_pattern(failure_record(failing[0], gold[target]))
        tasks = {t.id: t for t in engine.train_tasks}
        return attach([pattern], evidence.measurements, evidence.trajectories, tasks)

    async def propose(self, engine: Engine, evidence: Evidence, key: str, target: str | None) -> Proposal:
        (pattern,) = self.patterns(engine, evidence, target)
        writer = SpecWriter(engine.store, engine.run_id, engine.roles, engine.cfg.roles)
        outcome = await writer.write(key, evidence.current, [pattern], 0, debate=False,
                                     earlier=earlier_edits(engine, target))
        return Proposal(outcome.spec, [pattern], error=outcome.error, source=outcome.source, target=target)


def earlier_edits(engine: Engine, task_id: str) -> str:
    """What earlier steps tried for this failure and how it ended."""
    return "\n".join(f"{key}: {e.tried or 'no valid spec'} -> {'accepted' if e.accepted else 'rejected'} "
                     f"({e.reason[:200]})" for key, e in load_all(engine.store, engine.run_id, SerialEdit)
                     if e.task == task_id and e.attempted)
