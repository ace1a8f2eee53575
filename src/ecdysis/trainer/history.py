"""What a run already tried: earlier steps' specs and decisions, read back from the store.

The proposers see this history (never the engine): the roles are told what earlier steps tried so they do
not repeat a rejected spec, and the library does not offer a spec or a harness the run already rejected.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ..store.db import RunStore
from . import records
from .records import RoundRecord, SerialEdit, SpecRecord
from .spec import HarnessSpec

SHOWN_ROUNDS = 8  # earlier rounds the roles see in full (with every accepted one): ~60 tokens each


@dataclass(frozen=True)
class StepHistory:
    """The stored decisions of one run (rounds and per-failure edits)."""

    store: RunStore
    run_id: str

    def _earlier_rounds(self, r: int) -> Iterator[tuple[int, RoundRecord | None, SpecRecord | None]]:
        """Rounds 1 .. r-1 as stored: (round, its decision, its spec)."""
        for k in range(1, r):
            yield (k, records.load(self.store, self.run_id, RoundRecord, f"r{k}"),
                   records.load(self.store, self.run_id, SpecRecord, f"r{k}"))

    def _edits(self) -> list[tuple[str, SerialEdit]]:
        return records.load_all(self.store, self.run_id, SerialEdit)

    def earlier_attempts(self, r: int, shown: int = SHOWN_ROUNDS) -> str:
        """What earlier rounds tried and how it ended, so a new round does not repeat a rejected spec: every
        accepted round and the latest `shown` rounds, in order; the older rejected ones are counted, not listed,
        so the roles' prompt stays bounded however long the run (a spec or harness the run rejected is still
        never validated again: `rejected_specs`, `rejected_candidates`)."""
        rows = list(self._earlier_rounds(r))
        lines, hidden = [], 0
        for i, (k, decision, spec) in enumerate(rows):
            accepted = bool(decision and decision.accepted)
            if not accepted and i < len(rows) - shown:
                hidden += 1
                continue
            changes = HarnessSpec.model_validate(spec.spec).summary() if spec and spec.spec else ""
            reason = (decision.reason or "") if decision else ""
            lines.append(f"round {k}: {changes or 'no valid spec'} -> {'accepted' if accepted else 'rejected'} "
                         f"({reason[:200]})")
        if hidden:
            lines.insert(0, f"({hidden} older rejected round(s) not listed)")
        return "\n".join(lines)

    def earlier_edits(self, task_id: str) -> str:
        """What earlier per-failure steps tried for this failure and how it ended."""
        return "\n".join(f"{key}: {e.tried or 'no valid spec'} -> {'accepted' if e.accepted else 'rejected'} "
                         f"({e.reason[:200]})" for key, e in self._edits() if e.task == task_id and e.attempted)

    def rejected_specs(self, r: int) -> set[str]:
        """Summaries of the specs the run had rejected: in rounds 1 .. r-1, and in per-failure steps."""
        rounds = {HarnessSpec.model_validate(spec.spec).summary() for _, decision, spec in self._earlier_rounds(r)
                  if decision is not None and not decision.accepted and decision.decision_taken and spec is not None
                  and spec.spec is not None}
        return rounds | {e.tried for _, e in self._edits() if e.tried and not e.accepted and e.decision_taken}

    def rejected_candidates(self) -> set[str]:
        """Harness ids this run already validated and rejected: the same harness would be decided the same."""
        rounds = {r.candidate for _, r in records.load_all(self.store, self.run_id, RoundRecord)
                  if r.candidate and not r.accepted and r.decision_taken}
        return rounds | {e.harness for _, e in self._edits() if e.harness and not e.accepted and e.decision_taken}
