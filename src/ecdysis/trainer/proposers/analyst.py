"""The aggregating proposers: `aggregate` (one analyst writes the spec) and `ecdysis` (the FDCR debate).

Both read the step's recurring patterns with their measured levers and what earlier rounds tried. A measured
lever that covers every recurring pattern is the candidate policy's (trainer/candidates.py), not theirs.
"""

from __future__ import annotations

from .base import Evidence, Proposal, Proposer, ProposerContext


class AnalystProposer(Proposer):
    def __init__(self, name: str, debate: bool) -> None:
        self.name, self.debate = name, debate

    async def propose(self, ctx: ProposerContext, evidence: Evidence, key: str, target: str | None) -> Proposal:
        outcome = await ctx.writer.write(key, evidence.current, evidence.patterns, ctx.settings.train.debate_passes,
                                         debate=self.debate, earlier=ctx.history.earlier_attempts(evidence.round),
                                         tried=ctx.no_new_try(evidence))
        return Proposal(outcome.spec, evidence.patterns, error=outcome.error, source=outcome.source,
                        stopped=outcome.stopped)
