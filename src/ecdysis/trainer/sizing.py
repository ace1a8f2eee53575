"""Sizing the acceptance split from the data: the effect a split of n tasks can detect, the size that detects an
effect, and the warning when a split cannot tell the effects worth detecting from noise.

The model (docs/acceptance.md): a candidate of true effect d (its mean score minus the current harness's)
changes the outcome of a share `background + d` of the tasks, winning background/2 + d of them and losing
background/2. `background` is the share of tasks whose outcome flips with no real effect: an edit's side effects
at temperature 0, sampling noise otherwise (with trials, the measured noise: how often two trials of the current
harness disagree). Power is exact, for the one-look exact sign test at level alpha (`sequential.py`); the
sequential rule's power is within a few points of it (benchmarks/acceptance_calibration.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from math import exp, lgamma, log

BACKGROUND = 0.1  # the share of tasks an edit flips with no net effect (when not measured)
POWER = 0.8


def _log_pmf(n: int, k: int, p: float) -> float:
    if p <= 0.0:
        return 0.0 if k == 0 else float("-inf")
    if p >= 1.0:
        return 0.0 if k == n else float("-inf")
    return lgamma(n + 1) - lgamma(k + 1) - lgamma(n - k + 1) + k * log(p) + (n - k) * log(1 - p)


def _upper(n: int, c: int, p: float) -> float:
    """P(Bin(n, p) >= c)."""
    return sum(exp(_log_pmf(n, k, p)) for k in range(max(c, 0), n + 1))


@lru_cache(maxsize=8192)
def _critical(discordant: int, alpha: float) -> int:
    """The fewest wins among `discordant` pairs the exact sign test accepts at level alpha (> discordant: none)."""
    tail = 0.0
    for k in range(discordant, -1, -1):
        tail += exp(_log_pmf(discordant, k, 0.5))
        if tail > alpha + 1e-12:
            return k + 1
    return 0


def power(n: int, effect: float, alpha: float, background: float = BACKGROUND) -> float:
    """The chance that the exact sign test on n tasks accepts a candidate of true `effect` (model above)."""
    r = min(1.0, background + effect)
    if n <= 0 or r <= 0:
        return 0.0
    q = min(1.0, (background / 2 + effect) / r)
    spread = 10 * (n * r * (1 - r)) ** 0.5 + 2  # discordant counts beyond 10 sd carry no weight
    low, high = max(0, int(n * r - spread)), min(n, int(n * r + spread) + 1)
    return sum(exp(_log_pmf(n, d, r)) * _upper(d, _critical(d, alpha), q) for d in range(low, high + 1))


def detectable_effect(n: int, alpha: float, background: float = BACKGROUND, target: float = POWER) -> float | None:
    """The smallest effect (to 0.01; power rises with the effect) detected with `target` power on n tasks; None
    when not even +1.0 is."""
    if power(n, 1.0, alpha, background) < target:
        return None
    lo, hi = 0, 100
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if power(n, mid / 100, alpha, background) >= target else (mid, hi)
    return hi / 100


def size_for(effect: float, alpha: float, background: float = BACKGROUND, target: float = POWER,
             limit: int = 4000) -> int | None:
    """The smallest n (power rises with n up to small saw-teeth) detecting `effect` with `target` power."""
    lo, hi = 1, 4
    while power(hi, effect, alpha, background) < target:
        lo, hi = hi, hi * 2
        if hi > limit:
            return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if power(mid, effect, alpha, background) >= target else (mid, hi)
    return hi


@dataclass(frozen=True)
class SplitAdvice:
    tasks: int  # the acceptance split's size
    detectable: float | None
    proposed: int | None  # the size that detects `min_effect`
    warning: str | None


def advise(tasks: int, available: int, min_effect: float, alpha: float, rule: str = "sequential",
           background: float = BACKGROUND) -> SplitAdvice:
    """What a split of `tasks` tasks can detect, the size that detects `min_effect` (of `available` non-test
    tasks), and a warning when the split cannot detect `min_effect`."""
    detectable = detectable_effect(tasks, alpha, background) if tasks else None
    proposed = size_for(min_effect, alpha, background)
    if detectable is not None and detectable <= min_effect:
        return SplitAdvice(tasks, detectable, proposed, None)
    can = f"+{detectable:.2f} or more" if detectable is not None else "no effect at all"
    one = f"+{1 / tasks:.3f}" if tasks else "any"
    text = (f"{tasks} acceptance task(s) detect {can} (alpha {alpha:g}, {POWER:.0%} power); smaller effects, down to "
            f"a one-task change ({one}), cannot be told from noise")
    if rule != "sequential":
        text += f" — and under `{rule}` a one-task difference decides, with no stated false-accept rate"
    if proposed is not None:
        text += f". To detect +{min_effect:g} use about {proposed} val tasks (train.val_limit)"
        if proposed > available // 2:
            text += (f", more than half of your {available} train+val tasks: add tasks, or set train.min_effect to "
                     "the effect you can afford to detect")
    return SplitAdvice(tasks, detectable, proposed, text + ".")
