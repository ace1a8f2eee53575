"""An exact paired test on per-task outcomes, group-sequential with alpha spending (the `sequential` rule's maths).

Unit: a task. Its paired difference d = the candidate's mean score - the current harness's mean score over the
task's trials, in [-1, 1]. Null hypothesis H0: on each task the two harnesses' episodes are exchangeable (the
candidate changes nothing but noise), so every d is as likely to be +|d| as -|d|, independently. Statistic:
S = the sum of the d's. Its exact null distribution is the sign-flip distribution given the magnitudes seen;
with one 0/1 trial per task that is the one-sided exact sign test on the discordant pairs (McNemar's exact test),
which is also exact for the weaker H0 "the candidate's mean over the task population is no higher" (tasks
drawn independently: a discordant pair is then a win with probability 1/2 at effect 0).

The test looks after every batch of tasks, at information time t = tasks observed / pool size, and spends the
false-accept rate alpha by the Lan-DeMets Pocock-type function alpha(t) = alpha ln(1 + (e - 1) t) (on 8-64 tasks of
0/1 outcomes it kept the power of the O'Brien-Fleming-type function and stopped earlier: docs/acceptance.md).
The boundary at a look is the smallest S whose exact null probability of being first crossed there fits in the
alpha not spent yet, computed given the magnitudes seen (so it holds whatever they are). The false-accept rate is
therefore at most alpha for any number and placement of looks fixed in advance (batches), and stopping to reject
at any look (futility, budget, lost episodes) can only lower it; it is not guaranteed if tasks are added past
the pool. Reported p-values are stage-wise: P0(crossing at an earlier look) + P0(S >= observed at this look).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from math import comb, e, lcm, log, sqrt
from statistics import NormalDist

from .decision import Decision, evidence, mean_of, missing_reason, paired

N01 = NormalDist()
EPS = 1e-12


def spending(alpha: float, t: float) -> float:
    """Alpha spent by information time t (Lan-DeMets Pocock-type; alpha(1) = alpha)."""
    return 0.0 if t <= 0 else alpha if t >= 1 else alpha * log(1 + (e - 1) * t)


@dataclass(frozen=True)
class Look:
    """The test at one look: S and its boundary in grid units (accept when S >= boundary)."""

    tasks: int  # tasks observed through this look
    statistic: int
    boundary: int | None  # None: no S can cross here (the alpha left does not reach the largest S)
    spent: float  # alpha spent through this look: the exact null probability of crossing by now
    level: float  # alpha(t): the test accepts here exactly when p_value <= level
    p_value: float
    accepted: bool


def _convolve(dist: dict[int, float], magnitude: int, count: int) -> dict[int, float]:
    """`dist` plus `count` independent fair signs of size `magnitude`."""
    if magnitude == 0 or count == 0:
        return dist
    steps = {magnitude * (2 * j - count): comb(count, j) / 2 ** count for j in range(count + 1)}
    out: dict[int, float] = {}
    for s, p in dist.items():
        for step, q in steps.items():
            out[s + step] = out.get(s + step, 0.0) + p * q
    return out


def _tail(dist: dict[int, float], s: int) -> float:
    return sum(p for v, p in dist.items() if v >= s)


@lru_cache(maxsize=200_000)
def _plan(magnitudes: tuple[tuple[int, ...], ...], pool: int, alpha: float
          ) -> tuple[tuple[int | None, float, float, tuple[tuple[int, float], ...]], ...]:
    """For each look: (boundary, alpha spent before it, alpha spent through it, the null distribution of S there
    on paths not crossed before). Depends on the magnitudes only, never on the signs."""
    alive: dict[int, float] = {0: 1.0}
    spent, seen, out = 0.0, 0, []
    for look in magnitudes:
        seen += len(look)
        for m in sorted(set(look)):
            alive = _convolve(alive, m, look.count(m))
        available = spending(alpha, seen / pool) - spent
        boundary, crossing = None, 0.0
        for s in sorted(alive, reverse=True):  # the smallest S whose upper tail fits in what is left
            tail = crossing + alive[s]
            if tail > available + EPS:
                break
            boundary, crossing = s, tail
        out.append((boundary, spent, spent + crossing, tuple(sorted(alive.items()))))
        spent += crossing
        if boundary is not None:
            alive = {s: p for s, p in alive.items() if s < boundary}
    return tuple(out)


def run_looks(looks: list[list[int]], pool: int, alpha: float) -> list[Look]:
    """The test over `looks` (each: the signed grid differences of the tasks first observed at that look), up to
    and including the first look that crosses its boundary."""
    plan = _plan(tuple(tuple(sorted(abs(d) for d in look)) for look in looks), pool, alpha)
    out: list[Look] = []
    s, seen = 0, 0
    for look, (boundary, before, through, dist) in zip(looks, plan, strict=True):
        s += sum(look)
        seen += len(look)
        crossed = boundary is not None and s >= boundary
        p = before + _tail(dict(dist), s)
        out.append(Look(seen, s, boundary, through, spending(alpha, seen / pool), min(1.0, p), crossed))
        if crossed:
            break
    return out


def conditional_power(s: float, second_moment: float, n: int, pool: int, alpha: float, effect: float) -> float:
    """The chance of accepting at the end if the pool's remaining tasks had the design `effect` (normal
    approximation, d units). Used only to stop for futility, which can never raise the false-accept rate."""
    rest = pool - n
    if rest <= 0 or effect <= 0:
        return 0.0
    r = max(second_moment / n if n else 0.0, effect)  # E[d^2] under the design effect: at least the effect
    spread = sqrt(rest * max(r - effect ** 2, 1e-9))
    critical = N01.inv_cdf(1 - alpha) * sqrt(second_moment + rest * r)
    return 1 - N01.cdf((critical - s - rest * effect) / spread)


def exact_sign_test(wins: int, losses: int) -> float:
    """One-sided exact sign test (McNemar's exact test on discordant pairs): P(X >= wins), X ~ Bin(wins+losses, 1/2)."""
    n = wins + losses
    return sum(comb(n, k) for k in range(wins, n + 1)) / 2 ** n if n else 1.0


# the rule -------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SequentialRule:
    """`train.acceptance = "sequential"`: accept when the exact paired test crosses its boundary (false-accept
    rate <= alpha); reject when the pool is exhausted without it, when acceptance is out of reach, or when the
    chance of reaching it at the design effect `min_effect` falls below `futility` (0: only out of reach)."""

    alpha: float = 0.05
    min_effect: float = 0.1
    futility: float = 0.1
    name: str = "sequential"
    pools_exact_evidence: bool = True

    def start(self, current: dict[str, list[float]], expected: list[str], split: str = "train",
              batch: int | None = None, trials: int = 1) -> SequentialValidation:
        return SequentialValidation(self, current, list(expected), split, batch, trials)


class SequentialValidation:
    """One candidate's sequential test; stateless over the scores it is shown (a resumed run decides the same)."""

    def __init__(self, rule: SequentialRule, current: dict[str, list[float]], expected: list[str], split: str,
                 batch: int | None, trials: int) -> None:
        self.rule, self.current, self.expected, self.split, self.trials = rule, current, expected, split, trials
        self.size = batch or len(expected) or 1
        self.planned = -(-len(expected) // self.size)
        self.stopped_by: Decision | None = None
        lacking = [t for t in expected if len(current.get(t, [])) < trials]
        self.base_missing = f"current harness lacks {len(lacking)}/{len(expected)} {split} task(s)" if lacking else ""

    def _grid(self, candidate: dict[str, list[float]], tasks: list[str]) -> int:
        """Grid units per score point: every paired difference is a multiple of 1/grid (rounded otherwise)."""
        counts = {len(side[t]) for side in (self.current, candidate) for t in tasks}
        binary = all(s in (0.0, 1.0) for side in (self.current, candidate) for t in tasks for s in side[t])
        return lcm(*counts, 1) * (1 if binary else 20)

    def _looks(self, d: dict[str, float], grid: int, extra: dict[str, float] | None = None) -> list[list[int]]:
        """The tasks observed, grouped by the batch (look) they ran in; `extra` (hypothetical remaining tasks)
        join the batch they belong to, or the next look when theirs has passed."""
        looks: dict[int, list[int]] = {}
        for i, t in enumerate(self.expected):
            if t in d:
                looks.setdefault(i // self.size, []).append(round(d[t] * grid))
        last = max(looks, default=-1)
        for i, t in enumerate(self.expected):
            if extra is not None and t in extra:
                looks.setdefault(max(i // self.size, last + 1), []).append(round(extra[t] * grid))
        return [looks.get(j, []) for j in range(max(looks, default=-1) + 1)]

    def _decision(self, candidate: dict[str, list[float]], final: bool) -> Decision | None:
        rule, split, n_pool = self.rule, self.split, len(self.expected)
        tasks = [t for t in self.expected if len(candidate.get(t, [])) >= self.trials and self.current.get(t)]
        d = paired(self.current, candidate, tasks)
        cur = sum(mean_of(self.current[t]) for t in tasks) / len(tasks) if tasks else 0.0
        cand = sum(mean_of(candidate[t]) for t in tasks) / len(tasks) if tasks else 0.0
        wins, losses = sum(x > 0 for x in d.values()), sum(x < 0 for x in d.values())
        head = f"{split} {cur:.3f} -> {cand:.3f} on {len(tasks)}/{n_pool} tasks (+{wins} -{losses})"
        grid = self._grid(candidate, tasks)
        looks = run_looks(self._looks(d, grid), n_pool, rule.alpha) if d else []
        last = looks[-1] if looks else Look(0, 0, None, 0.0, 0.0, 1.0, False)
        done = len(tasks) == n_pool
        at = f"{len(looks)}/{self.planned}"

        def make(accepted: bool, why: str, stopped: str, taken: bool = True) -> Decision:
            ev = evidence("sequential test", rule.name, split, self.current, candidate, tasks, n_pool, self.trials,
                          stopped, alpha=rule.alpha, p_value=last.p_value, threshold=last.level, looks=at)
            return Decision(accepted, rule.name, cur, cand, f"{head}: {why}", taken, len(tasks),
                            taken and not done and not final, ev)

        p = f"p={last.p_value:.3g}"
        if last.accepted:
            early = " early" if not done else ""
            return make(True, f"{p} <= {last.level:.3g} at look {at}: accepted{early} (false-accept rate <= "
                        f"{rule.alpha:g})", f"accepted{early}: the test crossed its boundary")
        if done:
            return make(False, f"{p}, not <= {last.level:.3g}: no significant gain over the whole pool, rejected",
                        "the pool is exhausted without significance")
        if final:
            return make(False, f"not decided: {p} so far", "not decided: the evaluation is incomplete", taken=False)
        rest = {t: 1.0 for t in self.expected if t not in d}
        if not any(x.accepted for x in run_looks(self._looks(d, grid, rest), n_pool, rule.alpha)):
            return make(False, f"{p}: rejected early (out of reach even if every remaining task were won)",
                        "rejected early: acceptance is out of reach")
        s, v = sum(d.values()), sum(x * x for x in d.values())
        chance = conditional_power(s, v, len(d), n_pool, rule.alpha, rule.min_effect)
        if chance < rule.futility:
            return make(False, f"{p}: rejected early (futility: {chance:.0%} chance of significance if the "
                        f"remaining tasks had the effect +{rule.min_effect:g})", "rejected early: futility")
        return None

    def interim(self, partial: dict[str, list[float]]) -> Decision | None:
        if self.stopped_by is None and not self.base_missing:
            self.stopped_by = self._decision(partial, final=False)
        return self.stopped_by

    def conclude(self, candidate: dict[str, list[float]]) -> Decision:
        if self.stopped_by is not None:
            return self.stopped_by
        if self.base_missing:
            return Decision(False, self.rule.name, 0.0, 0.0, f"not decided: {self.base_missing}", taken=False)
        decision = self._decision(candidate, final=True)
        assert decision is not None  # final: always decided or not taken
        if not decision.taken and (why := missing_reason(self.current, candidate, self.expected, self.split,
                                                          self.trials)):
            decision = replace(decision, reason=f"{decision.reason}; {why}")
        return decision
