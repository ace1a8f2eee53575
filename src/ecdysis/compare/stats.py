"""The claim's statistics (docs/claim.md), as pure functions of plain numbers; every bootstrap is seeded.

- **Time to target, censored.** An arm's time to a pre-registered val accuracy is the charged time of the first
  curve point reaching it; an arm that never reaches it within the budget is *censored* at the budget (never
  dropped). Over seeds the summary is the restricted mean time to target up to the budget τ (RMST: the area
  under the Kaplan–Meier curve of "not reached yet" on [0, τ]); with every miss censored at τ it equals the
  mean of min(T, τ), misses counting τ. `reached` says how many seeds reached the target.
- **AUC.** The area under the val-accuracy step curve on [0, τ], divided by τ: the time-averaged accuracy.
- **Paired test differences.** Arm A minus arm B on the same test tasks of the same seed, averaged over every
  (seed, task) pair; the interval is a two-stage bootstrap (seeds with replacement, then tasks with replacement
  within each drawn seed), percentile.
- **Speed-up.** RMST(reference) / RMST(arm) over the seeds both ran, the interval a paired bootstrap over seeds.
- **Sign-flip p.** Beside the registered intervals (a percentile bootstrap over 5-8 seeds covers less than it
  says), an exact paired randomization test over seeds: under "the factor does nothing" the two arms of a seed
  are exchangeable, so every one of the 2^n swaps of their labels is as likely as the observed; the one-sided p
  is the share of swaps whose statistic is at least the observed one. Seeds where both arms are alike (both
  censored at τ) swap to the same value, so p can never fall below 2^-(seeds that differ): the test says how
  many informative seeds the experiment had. Reported, never a decision (the registered rules are intervals).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

CONFIDENCE = 0.95
REPS = 2000
EPS = 1e-9


@dataclass(frozen=True)
class TimeToTarget:
    """When a curve reached the target (`reached`), else the time it was censored at (the budget)."""

    time: float
    reached: bool


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its percentile bootstrap interval (None when there is nothing to resample) over n."""

    value: float
    low: float | None
    high: float | None
    n: int

    def text(self, digits: int = 3, signed: bool = False) -> str:
        def f(x: float) -> str:
            return f"{x:+.{digits}f}" if signed else f"{x:.{digits}f}"
        if self.low is None or self.high is None:
            return f(self.value)
        return f"{f(self.value)} [{f(self.low)}, {f(self.high)}]"


def time_to_target(points: Sequence[tuple[float, float | None]], target: float, budget: float) -> TimeToTarget:
    """The first (time, score) point, in time order, whose score reaches `target` within `budget`; else censored
    at `budget`. A point without a score (its evaluation is missing) never reaches anything."""
    for time, score in sorted(points, key=lambda p: p[0]):
        if time > budget + EPS:
            break
        if score is not None and score >= target - EPS:
            return TimeToTarget(max(time, 0.0), True)
    return TimeToTarget(budget, False)


def kaplan_meier(observations: Sequence[TimeToTarget]) -> list[tuple[float, float]]:
    """The Kaplan–Meier estimate of S(t) = P(target not reached by t): (event time, S just after it), in time
    order; S is 1 before the first event. Censored observations leave the risk set after their time."""
    at_risk, survival, steps = len(observations), 1.0, []
    for time in sorted({o.time for o in observations}):
        events = sum(o.reached for o in observations if o.time == time)
        if events and at_risk:
            survival *= 1 - events / at_risk
            steps.append((time, survival))
        at_risk -= sum(1 for o in observations if o.time == time)
    return steps


def restricted_mean(observations: Sequence[TimeToTarget], tau: float) -> float:
    """The restricted mean time to target on [0, tau]: the area under the Kaplan–Meier curve up to tau."""
    if not observations:
        raise ValueError("the restricted mean needs at least one observation")
    area, last, survival = 0.0, 0.0, 1.0
    for time, after in kaplan_meier(observations):
        if time >= tau:
            break
        area += survival * (time - last)
        last, survival = time, after
    return area + survival * (tau - last)


def auc(points: Sequence[tuple[float, float | None]], tau: float) -> float | None:
    """The time-averaged score of a step curve on [0, tau]: each (time, score) point's score holds until the next
    point; the first point's score holds from 0 (every arm starts from the seed harness, whose evaluation is the
    first point); a later point without a score keeps the last known one; the last holds until tau. None when
    the first point has no score (where the curve starts is unknown: a later score is never carried back)."""
    ordered = sorted(points, key=lambda p: p[0])
    if not ordered or ordered[0][1] is None or tau <= 0:
        return None
    area, last_time, current = 0.0, 0.0, ordered[0][1]
    for time, score in ordered:
        time = min(max(time, 0.0), tau)
        area += current * (time - last_time)
        last_time = time
        if score is not None:
            current = score
    return (area + current * (tau - last_time)) / tau


def _percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of `values`, linear interpolation between order statistics."""
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _interval(draws: list[float], confidence: float) -> tuple[float | None, float | None]:
    if not draws:
        return None, None
    tail = (1 - confidence) / 2
    return _percentile(draws, tail), _percentile(draws, 1 - tail)


def bootstrap(units: int, statistic: Callable[[list[int]], float | None], reps: int = REPS, seed: int = 0,
              confidence: float = CONFIDENCE) -> tuple[float | None, float | None]:
    """Percentile interval of `statistic(indices)` over `reps` resamples of `units` indices with replacement
    (a resample whose statistic is None is skipped); (None, None) with fewer than 2 units."""
    if units < 2:
        return None, None
    rng = random.Random(seed)
    draws = [v for _ in range(reps) if (v := statistic([rng.randrange(units) for _ in range(units)])) is not None]
    return _interval(draws, confidence)


def mean_estimate(values: Sequence[float], reps: int = REPS, seed: int = 0) -> Estimate | None:
    """The mean with a bootstrap interval over the values (e.g. one AUC per seed)."""
    if not values:
        return None
    low, high = bootstrap(len(values), lambda idx: sum(values[i] for i in idx) / len(idx), reps, seed)
    return Estimate(sum(values) / len(values), low, high, len(values))


def rmst_estimate(observations: Sequence[TimeToTarget], tau: float, reps: int = REPS, seed: int = 0) -> Estimate:
    """The restricted mean time to target over seeds, with a bootstrap interval over seeds."""
    obs = list(observations)
    low, high = bootstrap(len(obs), lambda idx: restricted_mean([obs[i] for i in idx], tau), reps, seed)
    return Estimate(restricted_mean(obs, tau), low, high, len(obs))


def speedup_estimate(reference: dict[int, TimeToTarget], arm: dict[int, TimeToTarget], tau: float,
                     reps: int = REPS, seed: int = 0) -> Estimate | None:
    """RMST(reference) / RMST(arm) over the seeds both have, with a paired bootstrap over those seeds."""
    seeds = sorted(set(reference) & set(arm))
    if not seeds:
        return None

    def ratio(idx: list[int]) -> float | None:
        den = restricted_mean([arm[seeds[i]] for i in idx], tau)
        return restricted_mean([reference[seeds[i]] for i in idx], tau) / den if den > 0 else None

    value = ratio(list(range(len(seeds))))
    if value is None:
        return None
    low, high = bootstrap(len(seeds), ratio, reps, seed)
    return Estimate(value, low, high, len(seeds))


EXACT_UP_TO = 14  # seeds: up to 2^14 swaps are enumerated; beyond, `reps` seeded random swaps


def sign_flip_p(units: int, statistic: Callable[[list[bool]], float | None], reps: int = REPS,
                seed: int = 0) -> float | None:
    """One-sided p of a paired randomization test: the share of label swaps (`statistic(swapped)`, one flag per
    unit) whose statistic is >= the observed one (no unit swapped), counting the observed; every swap pattern
    when `units` <= EXACT_UP_TO, else `reps` seeded ones. None with fewer than 2 units or no observed statistic;
    a swap whose statistic is None is skipped."""
    observed = statistic([False] * units) if units >= 2 else None
    if observed is None:
        return None
    if units <= EXACT_UP_TO:
        patterns = ([bool(mask >> i & 1) for i in range(units)] for mask in range(1 << units))
    else:
        rng = random.Random(seed)
        patterns = iter([[False] * units] + [[rng.random() < 0.5 for _ in range(units)] for _ in range(reps)])
    values = [v for flags in patterns if (v := statistic(flags)) is not None]
    return sum(v >= observed - EPS for v in values) / len(values)


def speedup_p(reference: dict[int, TimeToTarget], arm: dict[int, TimeToTarget], tau: float,
              reps: int = REPS, seed: int = 0) -> float | None:
    """`sign_flip_p` of RMST(reference) / RMST(arm) over the seeds both have: small when the arm is sooner."""
    seeds = sorted(set(reference) & set(arm))

    def ratio(swapped: list[bool]) -> float | None:
        pairs = [(arm[s], reference[s]) if flip else (reference[s], arm[s])
                 for s, flip in zip(seeds, swapped, strict=True)]
        den = restricted_mean([a for _, a in pairs], tau)
        return restricted_mean([r for r, _ in pairs], tau) / den if den > 0 else None

    return sign_flip_p(len(seeds), ratio, reps, seed)


def mean_p(differences: Sequence[float], reps: int = REPS, seed: int = 0) -> float | None:
    """`sign_flip_p` of the mean of per-seed differences (arm minus without): small when they are above 0."""
    diffs = list(differences)

    def mean(swapped: list[bool]) -> float:
        return sum(-d if flip else d for d, flip in zip(diffs, swapped, strict=True)) / len(diffs)

    return sign_flip_p(len(diffs), mean, reps, seed)


def paired_differences(a: dict[int, dict[str, float]], b: dict[int, dict[str, float]]) -> dict[int, list[float]]:
    """Per seed, a's score minus b's on each test task both scored (sorted by task id)."""
    out = {}
    for seed in sorted(set(a) & set(b)):
        tasks = sorted(set(a[seed]) & set(b[seed]))
        if tasks:
            out[seed] = [a[seed][t] - b[seed][t] for t in tasks]
    return out


def paired_estimate(a: dict[int, dict[str, float]], b: dict[int, dict[str, float]], reps: int = REPS,
                    seed: int = 0, confidence: float = CONFIDENCE) -> Estimate | None:
    """Mean paired test difference a - b over (seed, task) pairs, with a two-stage bootstrap interval: seeds with
    replacement, then tasks with replacement within each drawn seed. One seed: tasks only. n = pairs."""
    diffs = paired_differences(a, b)
    if not diffs:
        return None
    groups = list(diffs.values())
    pairs = [d for g in groups for d in g]
    value = sum(pairs) / len(pairs)
    if len(pairs) < 2:
        return Estimate(value, None, None, len(pairs))
    rng = random.Random(seed)
    draws = []
    for _ in range(reps):
        chosen = [groups[rng.randrange(len(groups))] for _ in groups] if len(groups) > 1 else groups
        sample = [g[rng.randrange(len(g))] for g in chosen for _ in g]
        draws.append(sum(sample) / len(sample))
    low, high = _interval(draws, confidence)
    return Estimate(value, low, high, len(pairs))
