"""The aggregating proposers: `aggregate` (one analyst writes the spec) and `ecdysis` (the FDCR debate).

Both read the round's recurring patterns with their measured levers. With
`train.engine.skip_debate_when_verified`, a round whose recurring patterns are all covered by one measured
lever that gains tasks and loses none gets that lever as its spec without any role call: the roles could
only add unmeasured edits next to it (and `with_verified_levers` would add the lever to their spec anyway).
With `train.engine.skip_debate_when_measured` as well, a lever whose replay changes failing episodes in
every recurring pattern and touches no passing one (tool and multi-turn episodes replay cannot grade to the
end: `error_answer`, `coerce_types` on a multi-turn task) is tried the same way when no gaining lever covers
them; validation decides. When an earlier round validated that same spec and rejected it, the round goes to
the roles.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..evidence import LeverEffect, Pattern
from ..fdcr import SpecWriter
from ..spec import Change, HarnessSpec, max_items
from .base import Evidence, Proposal, Proposer

if TYPE_CHECKING:
    from ..engine import Engine


def covering_lever(patterns: list[Pattern], changed: bool = False) -> LeverEffect | None:
    """One measured lever that gains tasks and loses none in every recurring pattern, if any (the first such,
    in the first pattern's order: best gain first). `changed`: else one that changes failing episodes of
    every recurring pattern and no passing episode (its outcome needs agent runs: validation decides)."""
    recurring = [p for p in patterns if p.recurring]
    if not recurring:
        return None

    def acts(m: LeverEffect) -> bool:
        return m.gains_losing_none or m.acts_only_on_failing

    gains = _covering(recurring, lambda m: m.gains_losing_none)
    return gains or (_covering(recurring, acts) if changed else None)


def _covering(recurring: list[Pattern], ok: Callable[[LeverEffect], bool]) -> LeverEffect | None:
    for lever in (m for m in recurring[0].measured or [] if ok(m)):
        if all(any(m.lever == lever.lever and ok(m) for m in p.measured or []) for p in recurring[1:]):
            return lever
    return None


def lever_spec(patterns: list[Pattern], lever: LeverEffect) -> HarnessSpec | None:
    """The spec that enables the lever's repairs for every recurring pattern."""
    names = lever.repairs
    if len(names) > max_items("changes"):
        return None
    ids = [p.id for p in patterns if p.recurring]
    effect = (f"+{lever.gained} task(s), 0 lost" if lever.gained else
              f"{lever.changed_failing} failing episode(s) changed, no passing one")
    changes = [Change(layer="H2", kind="enable_repair", repair=n, text="",
                      rationale=f"{', '.join(ids)}: measured on the stored replies ({effect}); written by the "
                                "library, no debate") for n in names]
    return HarnessSpec(patterns_addressed=ids, changes=changes, skills=[],
                       implementation_notes="measured lever covering every recurring pattern",
                       expected_effect=f"the measured gain of {lever.lever}")


class AnalystProposer(Proposer):
    def __init__(self, name: str, debate: bool) -> None:
        self.name, self.debate = name, debate

    async def propose(self, engine: Engine, evidence: Evidence, key: str, target: str | None) -> Proposal:
        cfg = engine.cfg
        e = cfg.train.engine
        if e.skip_debate_when_verified and (lever := covering_lever(evidence.patterns, e.skip_debate_when_measured)):
            spec = lever_spec(evidence.patterns, lever)
            # a lever an earlier round already validated and rejected goes to the roles instead of repeating
            if spec is not None and spec.summary() not in engine.rejected_specs(evidence.round):
                return Proposal(spec, evidence.patterns, source=f"library: {lever.lever} covers every "
                                "recurring pattern; no role asked")
        writer = SpecWriter(engine.store, engine.run_id, engine.roles, cfg.roles)
        outcome = await writer.write(key, evidence.current, evidence.patterns, cfg.train.debate_passes,
                                     debate=self.debate, earlier=engine.earlier_attempts(evidence.round))
        return Proposal(outcome.spec, evidence.patterns, error=outcome.error, source=outcome.source)
