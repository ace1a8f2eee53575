"""A method's candidate policy: which of the library's own candidates a step gets next to the proposer's spec.

- `measured_lever`: with `train.engine.skip_debate_when_verified`, a step whose patterns are all covered by
  one measured lever that gains tasks and loses none gets that lever as its spec without any role call (the
  roles could only add unmeasured edits next to it, and `with_verified_levers` adds the lever to their spec
  anyway). With `train.engine.skip_debate_when_measured` as well, a lever whose replay changes failing
  episodes in every pattern and touches no passing one (tool and multi-turn episodes replay cannot grade to
  the end: `error_answer`, `coerce_types` on a multi-turn task) is tried the same way when no gaining lever
  covers them; validation decides. A spec the run already validated and rejected goes to the roles instead.
- `variants`: validate the library's variants (e.g. a measured lever alone) next to the spec; else only
  variants made of the spec's own changes (its repairs alone).
- `fallback`: try the library's own specs when the roles give nothing that runs, a rejected harness or a no-op.

The spec writer (`fdcr.SpecWriter.policy`) follows the same policy: without `measured_lever` it neither sends a
spec back for leaving out a verified lever nor adds that lever; without `fallback` no library spec stands in when
the roles write no usable spec.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..config import Config
from .evidence import LeverEffect, Pattern
from .spec import Change, HarnessSpec, max_items


@dataclass(frozen=True)
class CandidatePolicy:
    """Which library candidates a method's steps get (see the module docstring)."""

    measured_lever: bool = True
    variants: bool = True
    fallback: bool = True

    def measured_spec(self, settings: Config, patterns: list[Pattern], rejected: set[str]
                      ) -> tuple[HarnessSpec, LeverEffect] | None:
        """The measured lever's spec for a step's patterns when the policy and the settings take it without
        a role call; None: the proposer writes the spec."""
        e = settings.train.engine
        if not (self.measured_lever and e.skip_debate_when_verified):
            return None
        lever = covering_lever(patterns, e.skip_debate_when_measured)
        spec = lever_spec(patterns, lever) if lever else None
        if spec is None or lever is None or spec.summary() in rejected:
            return None
        return spec, lever


LIBRARY = CandidatePolicy()
PUBLISHED = CandidatePolicy(measured_lever=False, variants=False, fallback=False)  # a baseline as published


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
