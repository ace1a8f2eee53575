"""Proposers: the part of a training method that turns evidence into a spec (see `base.Proposer`).

`serial` (one failure at a time, Life-Harness), `aggregate` (aggregated patterns, one analyst), `ecdysis`
(aggregated patterns, the FDCR debate). Another proposer registers itself in `PROPOSERS`.
"""

from __future__ import annotations

from collections.abc import Callable

from .analyst import AnalystProposer
from .base import Evidence, Proposal, Proposer
from .serial import SerialProposer

PROPOSERS: dict[str, Callable[[], Proposer]] = {
    "serial": SerialProposer,
    "aggregate": lambda: AnalystProposer("aggregate", debate=False),
    "ecdysis": lambda: AnalystProposer("ecdysis", debate=True),
}


def make_proposer(name: str) -> Proposer:
    if name not in PROPOSERS:
        raise ValueError(f"no proposer {name!r}; known: {', '.join(PROPOSERS)}")
    return PROPOSERS[name]()


__all__ = ["PROPOSERS", "AnalystProposer", "Evidence", "Proposal", "Proposer", "SerialProposer", "make_proposer"]
