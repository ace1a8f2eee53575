"""What a proposer gets (the evidence of one step) and gives back (a proposal), and its interface.

A method is a proposer plus the shared budget: the engine runs collect -> propose -> implement -> check ->
validate -> accept the same way for every proposer; a proposer only decides which failures a step targets
and turns the evidence into one harness modification spec.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ...agent.trajectory import Trajectory
from ...harness.manifest import HarnessVersion
from ..evaluation import Measured
from ..failures import Pattern
from ..levers import Measurement
from ..spec import HarnessSpec

if TYPE_CHECKING:
    from ..engine import Engine


@dataclass
class Evidence:
    """The current harness's training evaluation, its trajectories and its grounded patterns."""

    key: str  # the step the evidence belongs to (its records are stored under it)
    round: int
    current: HarnessVersion
    collect: Measured
    trajectories: list[Trajectory]
    patterns: list[Pattern]
    measurements: list[Measurement] = field(default_factory=list)

    @property
    def recurring(self) -> list[Pattern]:
        return [p for p in self.patterns if p.classification == "recurring"]


@dataclass
class Proposal:
    """One spec for one step (None: the proposer gave nothing valid, `error` says why)."""

    spec: HarnessSpec | None
    patterns: list[Pattern]  # the patterns the spec was written for (variants and fallbacks read them)
    error: str = ""
    source: str = "roles"  # "roles", or "library: ..." when the library wrote the spec (no role asked, or none
    # of the roles' output was usable)
    target: str | None = None  # serial: the failing task this edit is for


class Proposer(ABC):
    """Turns evidence into a spec. `per_failure`: one step per failed task (else one step per round)."""

    name: str = ""
    per_failure: bool = False
    library_fallback: bool = True  # try the library's own specs when the roles give nothing that runs
    library_variants: bool = True  # validate library variants (e.g. a measured lever) next to the spec; else
    # only variants made of the spec's own changes (its repairs alone)

    def patterns(self, engine: Engine, evidence: Evidence, target: str | None) -> list[Pattern]:
        """The patterns a step's spec is written for (deterministic: a resumed step rebuilds them)."""
        return evidence.patterns

    @abstractmethod
    async def propose(self, engine: Engine, evidence: Evidence, key: str, target: str | None) -> Proposal:
        """The spec for step `key` (stored by the caller; `target` only for per-failure proposers)."""
