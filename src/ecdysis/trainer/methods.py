"""The method registry: every training method and compare arm, declared once.

A method is a small composition over the one training loop (engine.py): a *schedule* (schedules.py: rounds
over aggregated patterns, or one failure at a time), a *proposer* (proposers/: analyst, debate, per-failure
analyst), a *candidate policy* (candidates.py: the library's measured levers, variants and fallbacks, on or
off), and the acceptance rule every method shares (`train.acceptance`, accept.py). Methods that do not run the
loop say how they run instead (`runs`). Every list of names (the trainer's arms, compare's arms and their
order, the arms with a training curve, the CLI help) derives from `METHODS`.

Adding a method: one `register(Method(...))` below (plus its test).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from .candidates import LIBRARY, PUBLISHED, CandidatePolicy
from .proposers import AnalystProposer, Proposer, SerialProposer
from .schedules import PerFailureSchedule, RoundSchedule, Schedule

Runs = Literal["evaluate", "engine", "gepa", "sample"]


@dataclass(frozen=True)
class Method:
    """One method. `runs`: evaluate (a fixed harness, never changed), engine (the training loop with this
    schedule, proposer and candidate policy), gepa (GEPA's own loop through our runner), sample (the fixed
    harness sampled k times per test task). `spend_of`: the method whose training spend this one is matched
    to (it runs after it in a compare)."""

    name: str
    summary: str
    runs: Runs
    schedule: Schedule | None = None
    proposer: Callable[[], Proposer] | None = None
    candidates: CandidatePolicy = LIBRARY
    spend_of: str | None = None

    @property
    def trains(self) -> bool:
        """True when the method changes the harness during training (it has a training curve)."""
        return self.runs in ("engine", "gepa")

    def __post_init__(self) -> None:
        if (self.runs == "engine") != (self.schedule is not None and self.proposer is not None):
            raise ValueError(f"method {self.name!r}: the training loop needs a schedule and a proposer (only)")


METHODS: dict[str, Method] = {}


def register(method: Method) -> Method:
    """Add a method (after any method it depends on: registry order is compare's run order)."""
    if method.name in METHODS:
        raise ValueError(f"method {method.name!r} is declared twice")
    if method.spend_of is not None and method.spend_of not in METHODS:
        raise ValueError(f"method {method.name!r} depends on {method.spend_of!r}: declare that first")
    METHODS[method.name] = method
    return method


def method(name: str) -> Method:
    """The declared method; ValueError naming the known ones."""
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; known: {', '.join(METHODS)}")
    return METHODS[name]


def trainer_methods() -> tuple[str, ...]:
    """Methods that run the training loop (`ecdysis train --arm`)."""
    return tuple(n for n, m in METHODS.items() if m.runs == "engine")


def trained_methods() -> tuple[str, ...]:
    """Methods with a training curve."""
    return tuple(n for n, m in METHODS.items() if m.trains)


def help_text(names: tuple[str, ...]) -> str:
    """`name (summary) | ...` for the CLI help."""
    return " | ".join(f"{n} ({METHODS[n].summary})" for n in names)


register(Method("direct", "bare harness: the reply is the answer", "evaluate"))
register(Method("fixed", "the seed harness, never changed", "evaluate"))
register(Method("serial", "per-failure search, as published", "engine", PerFailureSchedule(), SerialProposer,
                PUBLISHED))
register(Method("serial+library", "per-failure search with the library's candidates", "engine",
                PerFailureSchedule(), SerialProposer, LIBRARY))
register(Method("aggregate", "aggregated patterns, one analyst", "engine", RoundSchedule(),
                lambda: AnalystProposer("aggregate", debate=False), LIBRARY))
register(Method("ecdysis", "aggregated patterns, the FDCR debate", "engine", RoundSchedule(),
                lambda: AnalystProposer("ecdysis", debate=True), LIBRARY))
register(Method("gepa", "GEPA evolving the text layers", "gepa"))
register(Method("best-of-k", "the fixed harness sampled k times at ecdysis's spend", "sample", spend_of="ecdysis"))

# What `ecdysis train` runs without --arm: the registered rule's outcome on the designed suite's 8 seeds
# (benchmarks/designed/README.md, "The default method"): neither aggregation nor the debate showed a gain there.
DEFAULT_METHOD = "serial+library"
