"""The registered decision rules, applied mechanically to the factorial report (nothing judged by hand).

- **The claim** (benchmarks/designed/README.md, benchmarks/claim/README.md): an aggregation arm (`aggregate`,
  `ecdysis`) against a per-failure arm (`serial`, `serial+library`) *holds* when its speed-up to the target is
  >= `min_speedup` (the registration's; default 2) with the interval's lower bound above 1, and its paired
  test difference's interval lies above `-test_margin` (default 0.05). Anything else is a *miss*, with every
  unmet condition said.
- **A factor shows a gain** (the default method's rule, benchmarks/designed/README.md) when its speed-up
  interval lies above 1 or its AUC-difference interval above 0, and its paired test difference's interval lies
  above `-test_margin`.
- **The default method** (`ecdysis train --arm`; benchmarks/designed/README.md, "The default method"): with
  aggregation showing a gain, `ecdysis` if the debate shows one too, else `aggregate`; with aggregation showing
  none, `serial+library`, unless the debate shows a gain, which the registered rule leaves undecided.

A contrast's why ends with its speed-up's exact sign-flip p (compare/stats.py) where the report has one: reported
for a reader who distrusts a bootstrap over few seeds, never a condition. An estimate without an interval (one
seed) never meets a condition on its interval. When the registration
names its number of seeds, a contrast paired over fewer is *interim*: its rule is applied and shown, but nothing
is decided (the claim and the factors read "not decided") until every registered seed has run.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from rich.table import Table

from .factorial import REFERENCES, FactorialReport, FactorialRow, FactorRow, Registration, _cell
from .stats import Estimate

AGGREGATION_ARMS = ("aggregate", "ecdysis")  # judged against each per-failure arm of `REFERENCES`


@dataclass(frozen=True)
class Verdict:
    arm: str
    against: str
    holds: bool
    why: str  # what was met, or every condition that was not
    speedup: Estimate | None
    test_diff: Estimate | None
    seeds: int = 0  # the seeds both arms ran
    decided: bool = True  # False: fewer seeds than registered, an interim reading

    @property
    def outcome(self) -> str:
        text = "holds" if self.holds else "miss"
        return text if self.decided else f"interim: {text}"

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def _above(e: Estimate | None, bound: float) -> bool:
    return e is not None and e.low is not None and e.low > bound


def _low(e: Estimate, fmt: str) -> str:
    return "no interval" if e.low is None else f"lower bound {e.low:{fmt}}"


def _unmet_test(test: Estimate | None, margin: float) -> str | None:
    if test is None:
        return "no paired test difference"
    if not _above(test, -margin):
        return f"test difference not shown above -{margin:g} ({_low(test, '+.3f')})"
    return None


def interim(seeds: int, rule: Registration) -> bool:
    """Whether a contrast over `seeds` paired seeds falls short of the registered number."""
    return rule.seeds is not None and seeds < rule.seeds


def _short(seeds: int, rule: Registration) -> str:
    return f"{seeds} of {rule.seeds} registered seeds"


def claim_verdicts(rows: list[FactorialRow], rule: Registration) -> list[Verdict]:
    """Each aggregation arm against each per-failure arm that ran."""
    by_arm = {r.arm: r for r in rows}
    out = []
    for arm in AGGREGATION_ARMS:
        row = by_arm.get(arm)
        if row is None:
            continue
        for ref in REFERENCES:
            if ref not in by_arm:
                continue
            speed, test = (row.speedup_vs or {}).get(ref), (row.test_vs or {}).get(ref)
            unmet = []
            if speed is None:
                unmet.append("no speed-up (no curve)")
            else:
                if speed.value < rule.min_speedup:
                    unmet.append(f"speed-up {speed.value:.2f} < {rule.min_speedup:g}")
                if not _above(speed, 1.0):
                    unmet.append(f"speed-up not shown above 1 ({_low(speed, '.2f')})")
            if (why := _unmet_test(test, rule.test_margin)) is not None:
                unmet.append(why)
            met = f"speed-up {_cell(speed, 2)}, test {_cell(test, signed=True)}"
            seeds = (row.paired_seeds or {}).get(ref, 0)
            why = "; ".join(unmet) if unmet else met
            if (p := (row.speedup_p_vs or {}).get(ref)) is not None:
                why += f"; the speed-up's sign-flip p {p:.3f} (reported, not a condition)"
            if interim(seeds, rule):
                why = f"{_short(seeds, rule)}: {why}"
            out.append(Verdict(arm, ref, not unmet, why, speed, test, seeds, not interim(seeds, rule)))
    return out


def overall(verdicts: list[Verdict]) -> list[tuple[str, str, str]]:
    """Per aggregation arm, the claim as registered: it must hold against `serial+library`, not only `serial`,
    over every registered seed. (arm, "holds" / "miss" / "not decided", why)."""
    out = []
    for arm in dict.fromkeys(v.arm for v in verdicts):
        against = {v.against: v for v in verdicts if v.arm == arm}
        missed = [ref for ref, v in against.items() if not v.holds]
        short = [f"against {ref} over {v.seeds} seed{'' if v.seeds == 1 else 's'}"
                 for ref, v in against.items() if not v.decided]
        if "serial+library" not in against:
            out.append((arm, "not decided", "serial+library did not run"))
        elif short:
            reading = f"misses against {', '.join(missed)}" if missed else "holds so far"
            out.append((arm, "not decided", f"interim ({reading}): {'; '.join(short)}"))
        elif missed:
            out.append((arm, "miss", f"misses against {', '.join(missed)}"))
        else:
            out.append((arm, "holds", f"holds against {', '.join(against)}"))
    return out


def factor_gains(factors: list[FactorRow], rule: Registration) -> dict[str, tuple[bool, str]]:
    """factor -> (shows a gain, why); an interim factor (fewer seeds than registered) starts its why with
    "interim"."""
    out = {}
    for f in factors:
        gain, why = _gain(f, rule)
        out[f.factor] = (gain, f"interim, {_short(f.seeds, rule)}: {why}" if interim(f.seeds, rule) else why)
    return out


def _gain(f: FactorRow, rule: Registration) -> tuple[bool, str]:
    sooner, higher = _above(f.speedup, 1.0), _above(f.auc_diff, 0.0)
    test = _unmet_test(f.test_diff, rule.test_margin)
    if not (sooner or higher):
        return False, "neither the speed-up interval above 1 nor the AUC difference's above 0"
    shown = "speed-up interval above 1" if sooner else "AUC difference interval above 0"
    return test is None, shown if test is None else f"{shown}, but {test}"


def default_method(gains: dict[str, tuple[bool, str]]) -> tuple[str, str] | None:
    """The registered default-method rule on the factor gains: (method, why), or ("not decided", why) when the
    debate shows a gain and aggregation none; None without both factors."""
    if "aggregation" not in gains or "debate" not in gains:
        return None
    (aggregation, _), (debate, _) = gains["aggregation"], gains["debate"]
    said = (f"aggregation {'shows a gain' if aggregation else 'shows no gain'}, "
            f"the debate {'shows a gain' if debate else 'shows no gain'}")
    if aggregation:
        return ("ecdysis", said) if debate else ("aggregate", said)
    if debate:
        return "not decided", f"{said}: the registered rule names no default for this case"
    return "serial+library", said


@dataclass(frozen=True)
class Verdicts:
    """What the registration's rules decide on a factorial report: each contrast, the claim per aggregation
    arm (`overall`) and each factor's gain."""

    rule: Registration
    contrasts: list[Verdict]
    claim: list[tuple[str, str, str]]  # (arm, "holds" / "miss" / "not decided", why)
    gains: dict[str, tuple[bool, str]]  # factor -> (shows a gain, why)
    interim_factors: frozenset[str] = frozenset()  # factors paired over fewer seeds than registered

    @property
    def default(self) -> tuple[str, str, bool] | None:
        """(method, why, decided) by the default-method rule; not decided while either factor is interim."""
        found = default_method(self.gains)
        if found is None:
            return None
        return (*found, not ({"aggregation", "debate"} & self.interim_factors))

    def __bool__(self) -> bool:
        return bool(self.contrasts or self.gains)

    def table(self) -> Table:
        """The claim's verdict per pair of arms, then per aggregation arm, then each factor's gain."""
        rule = self.rule
        table = Table(title=f"The registered rules: the claim holds at speed-up >= {rule.min_speedup:g} with its "
                            f"interval above 1 and the test difference's above -{rule.test_margin:g}")
        for name in ("contrast", "verdict", "why"):
            table.add_column(name)
        for v in self.contrasts:
            table.add_row(f"{v.arm} vs {v.against}", v.outcome, v.why)
        for arm, outcome, why in self.claim:
            table.add_row(f"the claim, {arm}", outcome, why)
        for factor, (gain, why) in self.gains.items():
            outcome = "gain" if gain else "no gain"
            table.add_row(f"factor: {factor}", f"interim: {outcome}" if factor in self.interim_factors else outcome,
                          why)
        if (default := self.default) is not None:
            method, why, decided = default
            table.add_row("the default method (--arm)", method if decided else f"interim: {method}", why)
        return table

    def to_dict(self) -> dict[str, object]:
        """The verdicts as `factorial.json` keeps them."""
        return {"verdicts": [v.to_dict() for v in self.contrasts],
                "claim": {arm: {"outcome": outcome, "why": why} for arm, outcome, why in self.claim},
                "factor_gains": {f: {"gain": g, "why": why, "decided": f not in self.interim_factors}
                                 for f, (g, why) in self.gains.items()},
                "registered_seeds": self.rule.seeds,
                "default_method": None if (d := self.default) is None
                else {"method": d[0], "why": d[1], "decided": d[2]}}


def verdicts(report: FactorialReport) -> Verdicts:
    """The registration's rules applied to a factorial report."""
    contrasts = claim_verdicts(report.rows, report.registration)
    rule = report.registration
    return Verdicts(rule, contrasts, overall(contrasts), factor_gains(report.factors, rule),
                    frozenset(f.factor for f in report.factors if interim(f.seeds, rule)))
