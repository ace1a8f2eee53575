"""Acceptance rules: decide from two train evaluations (per-task scores over trials) whether to keep a candidate.

- strict: the train score strictly improves (the paper's rule);
- tolerance: keep unless the score drops by more than `tolerance`;
- noise-aware: keep only if the gain clears twice the standard error of the paired per-task
  difference, and no task that passed in every trial now fails in every trial.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import sqrt


@dataclass(frozen=True)
class Decision:
    accepted: bool
    rule: str
    current: float
    candidate: float
    reason: str


def _mean(per_task: dict[str, list[float]]) -> float:
    values = [sum(v) / len(v) for v in per_task.values() if v]
    return sum(values) / len(values) if values else 0.0


def decide(rule: str, current: dict[str, list[float]], candidate: dict[str, list[float]],
           tolerance: float = 0.05, split: str = "train") -> Decision:
    """Decide on per-task scores of the split edits are accepted on (`split` names it in the reason)."""
    cur, cand = _mean(current), _mean(candidate)
    if rule == "strict":
        ok = cand > cur
        verdict = "improves" if ok else "no strict gain"
        return Decision(ok, rule, cur, cand, f"{split} {cur:.3f} -> {cand:.3f}: {verdict}")
    if rule == "tolerance":
        ok = cand >= cur - tolerance
        return Decision(ok, rule, cur, cand,
                        f"{split} {cur:.3f} -> {cand:.3f}: {'within' if ok else 'beyond'} tolerance {tolerance}")
    if rule == "noise-aware":
        tasks = sorted(set(current) & set(candidate))
        diffs = [sum(candidate[t]) / len(candidate[t]) - sum(current[t]) / len(current[t]) for t in tasks]
        n = len(diffs)
        mean = sum(diffs) / n if n else 0.0
        if n > 1:
            var = sum((d - mean) ** 2 for d in diffs) / (n - 1)
            noise = 2 * sqrt(var / n)
        else:
            noise = 1.0
        broken = [t for t in tasks if all(s >= 1.0 for s in current[t]) and all(s < 1.0 for s in candidate[t])]
        ok = mean > noise and not broken
        why = f"paired gain {mean:+.3f} vs noise {noise:.3f}"
        if broken:
            why += f"; {len(broken)} reliably passing task(s) now fail reliably"
        return Decision(ok, rule, cur, cand, why)
    raise ValueError(f"unknown acceptance rule {rule!r}; use strict, tolerance or noise-aware")
