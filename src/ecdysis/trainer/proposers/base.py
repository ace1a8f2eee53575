"""What a proposer gets (a narrow context and the evidence of one step), what it gives back (a proposal), and
its interface.

A proposer never sees the engine: it reads the role models (through the spec writer), the settings, the
training tasks and the run's history of earlier attempts (`ProposerContext`), and turns the evidence of one
step into one harness modification spec. Which failures a step targets is the method's schedule
(trainer/schedules.py); which library candidates go next to the spec is its candidate policy
(trainer/candidates.py).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

from ...agent.trajectory import Trajectory
from ...config import Config
from ...envs.base import Task
from ...harness.manifest import HarnessVersion
from ..evaluation import Measured
from ..evidence import Pattern
from ..fdcr import SpecWriter, Tried
from ..history import StepHistory
from ..levers import Measurement
from ..spec import HarnessSpec


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


@dataclass(frozen=True)
class ProposerContext:
    """What a proposer may use: the roles (through the writer, which stores their transcripts), the settings,
    the training tasks (their gold answers ground failures) and what the run tried before (`history`, and
    `no_new_try`: whether a spec for a step's evidence would rebuild a harness already rejected)."""

    writer: SpecWriter
    settings: Config
    train_tasks: list[Task]
    history: StepHistory
    no_new_try: Callable[[Evidence], Tried] = lambda evidence: lambda spec: False


@dataclass
class Proposal:
    """One spec for one step (None: the proposer gave nothing valid, `error` says why)."""

    spec: HarnessSpec | None
    patterns: list[Pattern]  # the patterns the spec was written for (variants and fallbacks read them)
    error: str = ""
    source: str = "roles"  # "roles", or "library: ..." when the library wrote the spec (no role asked, or none
    # of the roles' output was usable)
    target: str | None = None  # per-failure schedule: the failing task this step is for
    stopped: str = ""  # the budget's stop reason when the budget stopped the roles (then no spec)


class Proposer(ABC):
    """Turns the evidence of one step into a spec."""

    name: str = ""

    def patterns(self, ctx: ProposerContext, evidence: Evidence, target: str | None) -> list[Pattern]:
        """The patterns a step's spec is written for (deterministic: a resumed step rebuilds them)."""
        return evidence.patterns

    @abstractmethod
    async def propose(self, ctx: ProposerContext, evidence: Evidence, key: str, target: str | None) -> Proposal:
        """The spec for step `key` (stored by the caller; `target`: the failing task of a per-failure step)."""
