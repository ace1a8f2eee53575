"""What `compare` measures and writes: one typed row per arm and seed, ratios from recorded numbers, times
read off the training curves, mean ± 95% CI over seeds (Student t); files.py writes and reads them.

Times from curves (`records.CurvePoint`, charged seconds and agent executions are cumulative training costs;
a time is a point's charged seconds, its real wall time for points recorded before charged time existed):
*time to the final harness* is the time of the first point whose harness is the arm's final one;
*time to serial's accuracy* is the first point whose score (val; train only where the curve has no val score
at all: a point whose val evaluation is missing, e.g. cut by the budget, has no score, never its train score)
reaches the final score of the serial arm of the same seed (none when serial ended no higher than its seed).
Speed-ups are serial's time (charged seconds) over the arm's (> 1: faster than serial); `executions_vs_serial`
is the arm's agent executions over serial's (> 1: more episodes than serial). The *after the seed eval*
speed-up takes each curve's step 0 (the seed's evaluation, the same work for every arm) off both times, leaving
what the optimizers spent (each at least 1 charged s: a fix measured by replaying stored replies costs a fraction
of a second, and a ratio over it would be noise).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from statistics import mean, stdev

from rich.table import Table

from ..trainer.methods import trained_methods
from ..trainer.records import CurvePoint

CONFIDENCE = 0.95
TRAINED = trained_methods()  # arms with a training curve


@dataclass
class ArmResult:
    arm: str
    seed: int
    train_wall_s: float = 0.0
    agent_executions: int = 0  # episodes actually run for training (best-of-k: its test-time samples)
    cached_executions: int = 0  # episodes served entirely from the response cache
    optimizer_calls: int = 0
    optimizer_tokens: int = 0
    agent_tokens: int = 0  # fresh agent tokens of training (best-of-k: of its samples); test passes excluded
    accepted_edits: int = 0
    rejected_edits: int = 0
    train_acc: float | None = None  # None: the final harness was not evaluated on the whole train split
    val_acc: float | None = None
    test_acc: float = 0.0
    pass_at_k: float = 0.0
    pass_hat_k: float = 0.0
    gap: float | None = None  # train - test
    k: int = 1
    k_uncapped: int | None = None  # best-of-k: floor(spend / per trial) before the cap (> k: it was capped)
    harness_id: str = ""
    stop_reason: str = ""
    transfer_acc: float | None = None
    speedup_vs_serial: float | None = None  # serial's training time (charged s) / this arm's
    executions_vs_serial: float | None = None  # this arm's agent executions / serial's (> 1: more than serial)
    time_to_final_s: float | None = None
    time_to_serial_acc_s: float | None = None  # None: never reached serial's final score
    executions_to_serial_acc: int | None = None
    speedup_to_serial_acc: float | None = None  # serial's time to its final score / this arm's time to it
    # the same with each side's seed evaluation (the curve's step 0, which every arm pays alike) taken off
    speedup_to_serial_acc_after_seed: float | None = None
    test_gain_vs_fixed: float | None = None  # relative: test / fixed test - 1
    test_delta_vs_fixed: float | None = None  # absolute: test - fixed test (defined when fixed scores 0)
    test_gain_vs_serial: float | None = None
    prefix_cache_rate: float | None = None  # prompt tokens the backends served from their prefix cache (training)
    train_charged_s: float | None = None  # charged training seconds (trainer/charged.py): the primary time
    budget_s: float | None = None  # the arm's `train.budget.wall_s` (charged seconds): censoring time of its curve
    test_per_task: dict[str, float] = field(default_factory=dict, repr=False)  # test task -> mean score (paired stats)
    charged_parts: dict[str, float] = field(default_factory=dict, repr=False)  # role / "sandbox" -> charged s
    cold_tokens: int | None = None  # training tokens (agent + roles) a cold run would spend, whatever was cached
    rates_version: str = ""  # the charged-time rate table it ran under (models/rates.toml `version`); "" unrecorded
    # what each training step came to -> [charged s, steps] (trainer/charged.charged_by_outcome)
    step_outcomes: dict[str, list[float]] = field(default_factory=dict, repr=False)
    curve: list[CurvePoint] = field(default_factory=list, repr=False)

    def training_tokens(self) -> int:
        """Training tokens as a cold run spends them (each paid request once, cached or not); results recorded
        before `cold_tokens` was kept: the fresh agent + optimizer tokens."""
        return self.cold_tokens or self.agent_tokens + self.optimizer_tokens

    def row(self) -> dict[str, object]:
        """The row written to compare.json (the curve goes to curves.csv; compare.csv leaves per-task scores out)."""
        return {k: v for k, v in asdict(self).items() if k != "curve"}


# ---- statistics -------------------------------------------------------------------------------------------

def t_two_sided_mass(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with integer `df` >= 1 (Abramowitz & Stegun 26.7.3-4, exact)."""
    theta = math.atan(t / math.sqrt(df))
    c2, s = math.cos(theta) ** 2, math.sin(theta)
    if df == 1:
        return 2 * theta / math.pi
    term, total = 1.0, 1.0
    if df % 2 == 0:  # sin(theta) * (1 + 1/2 c^2 + 1.3/(2.4) c^4 + ... up to c^(df-2))
        for j in range(2, df - 1, 2):
            term *= c2 * (j - 1) / j
            total += term
        return s * total
    for j in range(3, df - 1, 2):  # (2/pi)(theta + sin cos (1 + 2/3 c^2 + 2.4/(3.5) c^4 + ... up to c^(df-3)))
        term *= c2 * (j - 1) / j
        total += term
    return 2 / math.pi * (theta + s * math.cos(theta) * total)


def t_critical(df: int, confidence: float = CONFIDENCE) -> float:
    """The two-sided critical value t* with P(|T| <= t*) = confidence (bisection on the exact CDF)."""
    if df < 1:
        raise ValueError("the t distribution needs df >= 1")
    lo, hi = 0.0, 1.0
    while t_two_sided_mass(hi, df) < confidence:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_two_sided_mass(mid, df) < confidence else (lo, mid)
    return (lo + hi) / 2


@dataclass(frozen=True)
class Interval:
    """Mean of n values with the half-width of its confidence interval (None with fewer than 2 values)."""

    mean: float
    half_width: float | None
    n: int

    def __str__(self) -> str:
        digits = 3 if abs(self.mean) < 10 else 0
        text = f"{self.mean:.{digits}f}"
        return text if self.half_width is None else f"{text} ± {self.half_width:.{digits}f}"


def mean_ci(values: list[float], confidence: float = CONFIDENCE) -> Interval | None:
    """Mean ± t(confidence, n-1) * s / sqrt(n) of the values; None when there are none."""
    if not values:
        return None
    if len(values) == 1:
        return Interval(values[0], None, 1)
    half = t_critical(len(values) - 1, confidence) * stdev(values) / math.sqrt(len(values))
    return Interval(mean(values), half, len(values))


# ---- curves and ratios ------------------------------------------------------------------------------------

def curve_split(curve: list[CurvePoint]) -> str:
    """The split a curve is scored on: val when any of its points has a val score, else train."""
    return "val" if any(p.val_score is not None for p in curve) else "train"


def score(point: CurvePoint, split: str = "val") -> float | None:
    """The point's score on `split` (None when that evaluation is missing: never the other split's score)."""
    return point.val_score if split == "val" else point.train_score


def time_of(point: CurvePoint) -> float:
    """A point's training time: charged seconds, or real wall time for points recorded before them."""
    return point.charged_s if point.charged_s is not None else point.wall_s


def time_to_harness(curve: list[CurvePoint], harness_id: str) -> float | None:
    return next((time_of(p) for p in curve if p.harness_id == harness_id), None)


def first_reaching(curve: list[CurvePoint], target: float) -> CurvePoint | None:
    """The first point whose score reaches `target` (1e-9 tolerance), None when none does."""
    split = curve_split(curve)
    return next((p for p in curve if (s := score(p, split)) is not None and s >= target - 1e-9), None)


DERIVED = ("speedup_vs_serial", "executions_vs_serial", "time_to_final_s", "time_to_serial_acc_s",
           "executions_to_serial_acc", "speedup_to_serial_acc", "speedup_to_serial_acc_after_seed",
           "test_gain_vs_fixed", "test_delta_vs_fixed", "test_gain_vs_serial")


def improved_score(curve: list[CurvePoint]) -> float | None:
    """The final score of a curve that rose above its seed's (step 0), else None: when serial found nothing
    better than the seed there is no accuracy of serial's to reach (every arm 'reaches' it at step 0, and the
    ratio would compare seed evaluations)."""
    split = curve_split(curve)
    if not curve or (final := score(curve[-1], split)) is None:
        return None
    start = score(curve[0], split)
    return final if start is None or final > start + 1e-9 else None


AFTER_SEED_FLOOR_S = 1.0  # the after-seed times' floor: below a charged second a ratio says nothing (1378x)


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


def add_ratios(results: list[ArmResult]) -> None:
    """Per seed: ratios against `serial` (speed-up) and `fixed` (gain), and the curve-read times (any earlier
    values are replaced: pooled rows are recomputed with the current definitions)."""
    for r in results:
        for name in DERIVED:
            setattr(r, name, None)
        peers = {p.arm: p for p in results if p.seed == r.seed}
        serial, fixed = peers.get("serial"), peers.get("fixed")
        if r.curve:
            r.time_to_final_s = time_to_harness(r.curve, r.harness_id)
        if serial and r.curve and (target := improved_score(serial.curve)) is not None:
            reached, serial_reached = first_reaching(r.curve, target), first_reaching(serial.curve, target)
            r.time_to_serial_acc_s = time_of(reached) if reached else None
            r.executions_to_serial_acc = reached.agent_executions if reached else None
            r.speedup_to_serial_acc = _ratio(time_of(serial_reached) if serial_reached else None,
                                             r.time_to_serial_acc_s)
            if reached and serial_reached:  # each side at least 1 s: a lever measured by replay costs ~0.2 s
                r.speedup_to_serial_acc_after_seed = _ratio(
                    max(time_of(serial_reached) - time_of(serial.curve[0]), AFTER_SEED_FLOOR_S),
                    max(time_of(reached) - time_of(r.curve[0]), AFTER_SEED_FLOOR_S))
        if serial and r.arm in TRAINED and (r.train_charged_s or r.train_wall_s) > 0:
            charged = r.train_charged_s and serial.train_charged_s is not None  # else runs recorded before it
            r.speedup_vs_serial = (_ratio(serial.train_charged_s, r.train_charged_s) if charged
                                   else _ratio(serial.train_wall_s, r.train_wall_s))
            r.executions_vs_serial = _ratio(r.agent_executions, serial.agent_executions)
        if fixed:
            r.test_delta_vs_fixed = r.test_acc - fixed.test_acc
        if fixed and fixed.test_acc > 0:
            r.test_gain_vs_fixed = r.test_acc / fixed.test_acc - 1
        if serial and serial.test_acc > 0:
            r.test_gain_vs_serial = r.test_acc / serial.test_acc - 1


ABSOLUTE = (("test_acc", "test acc"), ("train_charged_s", "train charged s"), ("train_wall_s", "train wall s"),
            ("agent_executions", "episodes"),
            ("optimizer_tokens", "optimizer tokens"), ("time_to_final_s", "s to final"),
            ("time_to_serial_acc_s", "s to serial's acc"))
RATIOS = (("speedup_vs_serial", "speed-up vs serial (x)"), ("speedup_to_serial_acc", "speed-up to serial's acc (x)"),
          ("speedup_to_serial_acc_after_seed", "the same, after the seed eval (x)"))  # the per-seed table's labels
SUMMARY = ABSOLUTE + RATIOS
TRAINING_ONLY = ("train_charged_s", "train_wall_s", "optimizer_tokens")  # 0 for an arm that does not train


def summarize(results: list[ArmResult]) -> list[dict[str, object]]:
    """Per arm (in run order): each SUMMARY measure's mean, CI half-width and n over its seeds (None values,
    e.g. an arm that never reached serial's accuracy, are left out of n; so are the training costs of an arm
    that does not train, and an arm's ratios against itself)."""
    out = []
    for arm in dict.fromkeys(r.arm for r in results):
        rows = [r for r in results if r.arm == arm]
        entry: dict[str, object] = {"arm": arm, "seeds": len(rows), "confidence": CONFIDENCE}
        for key, _ in SUMMARY:
            meaningless = (key in TRAINING_ONLY and arm not in TRAINED) or (
                key == "agent_executions" and arm not in (*TRAINED, "best-of-k")) or (
                arm == "serial" and key.startswith("speedup"))
            ci = None if meaningless else mean_ci([float(v) for r in rows if (v := getattr(r, key)) is not None])
            entry[key] = None if ci is None else ci.mean
            entry[f"{key}_ci"] = None if ci is None else ci.half_width
            entry[f"{key}_n"] = 0 if ci is None else ci.n
        out.append(entry)
    return out


def seeds_of(results: list[ArmResult]) -> int:
    """The most seeds any arm has."""
    return max((len({r.seed for r in results if r.arm == a}) for a in {r.arm for r in results}), default=0)


def summary_tables(results: list[ArmResult]) -> list[Table]:
    """Mean ± 95% CI per arm over its seeds (the terminal tables printed after the per-seed one): absolute measures,
    then the ratios; none when no arm has two seeds (an interval needs two values; the per-seed table already
    shows each one). Columns no arm has a value for are left out."""
    seeds = seeds_of(results)
    if seeds < 2:
        return []
    entries = summarize(results)
    out = []
    for part, measures in (("", ABSOLUTE), (", ratios", RATIOS)):
        keys = [(key, name) for key, name in measures if any(e[key] is not None for e in entries)]
        if not keys:
            continue
        table = Table(title=f"Mean ± {CONFIDENCE:.0%} CI over {seeds} seeds{part} (Student t; n = seeds with a value)",
                      caption="train charged s: training time at the rate table's prices (the primary time; times "
                              "to final and to serial's acc in it too); train wall s: real time; episodes: agent "
                              "episodes run" if not part else None)
        table.add_column("arm", no_wrap=True, min_width=max(len(e["arm"]) for e in entries))  # type: ignore[arg-type]
        for _, name in keys:
            table.add_column(name, justify="right", no_wrap=True)
        for entry in entries:
            if all(entry[key] is None for key, _ in keys):
                continue  # e.g. serial or fixed in the ratios: nothing to compare with itself or to train
            cells = []
            for key, _ in keys:
                m, h, n = entry[key], entry[f"{key}_ci"], entry[f"{key}_n"]
                cell = "–" if m is None else str(Interval(float(m), None if h is None else float(h), int(n)))
                cells.append(cell + (f" (n={n})" if m is not None and n != entry["seeds"] else ""))
            table.add_row(str(entry["arm"]), *cells)
        out.append(table)
    return out
