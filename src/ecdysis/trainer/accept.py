"""Acceptance rules: decide from two evaluations on the acceptance split (val, or train when there is none: the
current harness's and the candidate's per-task scores over trials) whether to keep a candidate.

- strict: the train score strictly improves (the paper's rule);
- tolerance: keep unless the score drops by more than `tolerance`;
- noise-aware: keep only if the gain clears twice the standard error of the paired per-task
  difference, and no task that passed in every trial now fails in every trial.

`decide_on_same_tasks` is what the engine calls: the decision is taken on the same task ids on both sides
and only over complete evaluations; otherwise it is not taken (a rejection saying why).
`rejection_certain` is early-stopped validation: the candidate cannot be accepted whatever its
remaining tasks score (scores in [0, 1]; strict and tolerance only, whose outcome is monotone in them).
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
    taken: bool = True  # False: the evaluations were incomplete or disjoint, nothing was compared
    tasks: int = 0  # task ids compared


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


def decide_on_same_tasks(rule: str, current: dict[str, list[float]], candidate: dict[str, list[float]],
                         expected: list[str], tolerance: float = 0.05, split: str = "train",
                         trials: int = 1) -> Decision:
    """Decide over exactly `expected` on both sides; any task missing on either side means no decision."""
    missing = {side: [t for t in expected if len(scores.get(t, [])) < trials]
               for side, scores in (("current", current), ("candidate", candidate))}
    if missing["current"] or missing["candidate"]:
        why = "; ".join(f"{side} harness lacks {len(m)}/{len(expected)} {split} task(s)"
                        for side, m in missing.items() if m)
        return Decision(False, rule, _mean(current), _mean(candidate), f"not decided: {why}", taken=False)
    same = set(expected)
    d = decide(rule, {t: v for t, v in current.items() if t in same},
               {t: v for t, v in candidate.items() if t in same}, tolerance, split)
    return Decision(d.accepted, d.rule, d.current, d.candidate, d.reason, tasks=len(same))


def rejection_certain(rule: str, current: dict[str, list[float]], partial: dict[str, list[float]],
                      expected: list[str], tolerance: float = 0.05, split: str = "train") -> Decision | None:
    """A rejection when even a perfect score on the candidate's remaining tasks could not get it accepted;
    None when the outcome is still open (or the rule is not monotone: noise-aware)."""
    if rule not in ("strict", "tolerance") or any(t not in current for t in expected):
        return None
    best = {t: partial.get(t) or [1.0] for t in expected}
    base = {t: current[t] for t in expected}
    if decide(rule, base, best, tolerance, split).accepted:
        return None
    ran = [t for t in expected if t in partial]
    cur = _mean(base)
    return Decision(False, rule, cur, _mean({t: partial[t] for t in ran}),
                    f"{split} {cur:.3f} -> at most {_mean(best):.3f} after {len(ran)}/{len(expected)} task(s): "
                    "rejected early (the remaining tasks cannot change it)", tasks=len(ran))
