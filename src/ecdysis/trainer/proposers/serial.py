"""The per-failure proposer (Life-Harness-style serial search): one failure, one diagnose-and-edit call.

Each step's target is one failing training task of the current harness (the per-failure schedule picks it);
the proposer writes the spec for that failure alone, told what earlier steps tried for it.
"""

from __future__ import annotations

from ..evidence import Pattern
from ..failures import FailureRecord, failure_record, suggest_levers
from ..levers import attach
from .base import Evidence, Proposal, Proposer, ProposerContext


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

    def patterns(self, ctx: ProposerContext, evidence: Evidence, target: str | None) -> list[Pattern]:
        """The target's failure as its own pattern, with the measured levers of the current harness."""
        assert target is not None
        failing = [t for t in evidence.trajectories if t.task_id == target and not t.passed]
        gold = {t.id: t.gold for t in ctx.train_tasks}
        pattern = single_failure_pattern(failure_record(failing[0], gold[target]))
        tasks = {t.id: t for t in ctx.train_tasks}
        return attach([pattern], evidence.measurements, evidence.trajectories, tasks)

    async def propose(self, ctx: ProposerContext, evidence: Evidence, key: str, target: str | None) -> Proposal:
        (pattern,) = self.patterns(ctx, evidence, target)
        assert target is not None
        outcome = await ctx.writer.write(key, evidence.current, [pattern], 0, debate=False,
                                         earlier=ctx.history.earlier_edits(target), tried=ctx.no_new_try(evidence))
        return Proposal(outcome.spec, [pattern], error=outcome.error, source=outcome.source, target=target,
                        stopped=outcome.stopped)
