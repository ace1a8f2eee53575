"""The registered decision rules applied to the factorial report (`compare/verdict.py`), on known inputs."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import registered_summary

from ecdysis.compare.factorial import FactorialRow, FactorRow, Registration
from ecdysis.compare.results import ArmResult
from ecdysis.compare.stats import Estimate
from ecdysis.compare.verdict import claim_verdicts, factor_gains, overall
from ecdysis.trainer.records import CurvePoint

RULE = Registration(0.5, 600.0)


def est(value: float, low: float | None, high: float | None) -> Estimate:
    return Estimate(value, low, high, 8)


def row(arm: str, speedup: Estimate | None, test: Estimate | None, ref: str = "serial+library") -> FactorialRow:
    return FactorialRow(arm, 8, speedup_vs={ref: speedup}, test_vs={ref: test})


def test_the_claim_holds_only_when_every_registered_condition_is_met() -> None:
    rows = [FactorialRow("serial+library", 8),
            row("aggregate", est(2.4, 1.3, 3.9), est(0.01, -0.04, 0.06)),   # every condition met
            row("ecdysis", est(2.4, 0.9, 3.9), est(0.01, -0.08, 0.06))]     # interval reaches 1; test may lose 0.08
    verdicts = {v.arm: v for v in claim_verdicts(rows, RULE)}
    assert verdicts["aggregate"].holds and verdicts["aggregate"].against == "serial+library"
    assert not verdicts["ecdysis"].holds
    assert verdicts["ecdysis"].why == ("speed-up not shown above 1 (lower bound 0.90); test difference not shown "
                                       "above -0.05 (lower bound -0.080)")
    slow = claim_verdicts([FactorialRow("serial+library", 8), row("aggregate", est(1.5, 1.2, 1.8), est(0, -.01, .01))],
                          RULE)
    assert not slow[0].holds and slow[0].why == "speed-up 1.50 < 2"
    one_seed = claim_verdicts([FactorialRow("serial+library", 1), row("aggregate", est(3.0, None, None), None)], RULE)
    assert one_seed[0].why == "speed-up not shown above 1 (no interval); no paired test difference"
    # the claim must hold against serial+library, not only against serial
    both = [FactorialRow("serial", 8), FactorialRow("serial+library", 8),
            FactorialRow("aggregate", 8, speedup_vs={"serial": est(3, 2, 4), "serial+library": est(1.2, .9, 1.5)},
                         test_vs={"serial": est(0, -.01, .01), "serial+library": est(0, -.01, .01)})]
    assert overall(claim_verdicts(both, RULE)) == [("aggregate", "miss", "misses against serial+library")]
    alone = [FactorialRow("serial", 8), row("aggregate", est(3, 2, 4), est(0, -.01, .01), ref="serial")]
    assert [v.holds for v in claim_verdicts(alone, RULE)] == [True]
    assert overall(claim_verdicts(alone, RULE)) == [("aggregate", "not decided", "serial+library did not run")]
    looser = Registration(0.5, 600.0, min_speedup=1.4, test_margin=0.1)
    assert claim_verdicts([FactorialRow("serial+library", 8), row("ecdysis", est(1.5, 1.1, 1.9), est(0, -.08, .05))],
                          looser)[0].holds


def test_a_factor_shows_a_gain_by_speed_or_auc_without_losing_test_accuracy() -> None:
    factors = [FactorRow("library", "serial+library", "serial", est(1.11, 1.02, 1.16), est(.04, -.01, .09),
                         est(-.04, -.17, .02)),
               FactorRow("aggregation", "aggregate", "serial+library", est(1.06, 1.0, 1.2), est(.03, .01, .05),
                         est(.02, -.03, .06)),
               FactorRow("debate", "ecdysis", "aggregate", est(1.0, 1.0, 1.0), est(-.03, -.07, 0.0),
                         est(-.04, -.19, .04))]
    gains = factor_gains(factors, RULE)
    assert gains["library"] == (False, "speed-up interval above 1, but test difference not shown above -0.05 "
                                       "(lower bound -0.170)")
    assert gains["aggregation"] == (True, "AUC difference interval above 0")
    assert gains["debate"] == (False, "neither the speed-up interval above 1 nor the AUC difference's above 0")


def test_the_default_method_follows_the_registered_rule_and_waits_for_every_seed() -> None:
    from ecdysis.compare.verdict import Verdicts, default_method

    gain, none = (True, "AUC difference interval above 0"), (False, "neither")
    assert default_method({"aggregation": gain, "debate": none})[0] == "aggregate"
    assert default_method({"aggregation": gain, "debate": gain})[0] == "ecdysis"
    assert default_method({"aggregation": none, "debate": none}) == (
        "serial+library", "aggregation shows no gain, the debate shows no gain")
    assert default_method({"aggregation": none, "debate": gain})[0] == "not decided"
    assert default_method({"aggregation": gain}) is None  # no ecdysis arm: the rule has nothing to read
    gains = {"library": none, "aggregation": gain, "debate": none}
    final = Verdicts(RULE, [], [], gains)
    assert final.default == ("aggregate", "aggregation shows a gain, the debate shows no gain", True)
    assert final.to_dict()["default_method"] == {"method": "aggregate", "decided": True,
                                                 "why": "aggregation shows a gain, the debate shows no gain"}
    early = Verdicts(RULE, [], [], gains, frozenset({"debate"}))
    assert early.default is not None and early.default[2] is False
    assert any("interim: aggregate" in cell for column in early.table().columns for cell in column._cells)


def _curve(arm: str, at: float) -> list[CurvePoint]:
    def point(step: int, time: float, val: float) -> CurvePoint:
        return CurvePoint(arm=arm, step=step, harness_id=f"{arm}{step}", val_score=val, train_score=None,
                          wall_s=time, agent_executions=step, cached_executions=0, optimizer_calls=0,
                          optimizer_tokens=0, accepted=step > 0, charged_s=time)
    return [point(0, 100, 0.2), point(1, at, 0.6)]


def test_compare_summary_prints_and_saves_the_verdicts_with_the_registered_thresholds(tmp_path: Path) -> None:
    tasks = {"a": 1.0, "b": 0.0}
    results = [ArmResult(arm, s, test_acc=0.5, curve=_curve(arm, at + 10 * s), budget_s=1000.0, test_per_task=tasks)
               for s in (0, 1, 2) for arm, at in (("serial+library", 600.0), ("aggregate", 250.0))]
    printed, saved = registered_summary(tmp_path, results, "target = 0.5\nbudget_s = 1000\nmin_speedup = 3\n")
    assert "claim holds at speed-up >= 3" in printed
    (verdict,) = saved["verdicts"]
    assert verdict["arm"] == "aggregate" and verdict["against"] == "serial+library" and not verdict["holds"]
    # 610 / 260 s; its interval is above 1, the test equal; sooner on all 3 seeds: the exact p is 1/2^3
    assert verdict["why"] == "speed-up 2.35 < 3; the speed-up's sign-flip p 0.125 (reported, not a condition)"
    assert saved["factor_gains"]["aggregation"]["gain"] is True  # sooner on every seed, the same test tasks
    assert saved["claim"] == {"aggregate": {"outcome": "miss", "why": "misses against serial+library"}}
    (tmp_path / "typo.toml").write_text("target = 0.5\nmin_speed = 3\n")
    with pytest.raises(ValueError, match=r"typo\.toml: not a registration file.*min_speed"):
        Registration.read(tmp_path / "typo.toml")
    for bad in ("min_speedup = nan", "min_speedup = 0", "test_margin = -0.1", "min_speedup = true"):
        (tmp_path / "bad.toml").write_text(f"target = 0.5\n{bad}\n")
        with pytest.raises(ValueError, match="min_speedup must be a number > 0"):
            Registration.read(tmp_path / "bad.toml")


def test_the_summary_markdown_holds_every_printed_table_with_the_printed_numbers(tmp_path: Path) -> None:
    """`--out` writes summary.md: the factorial and verdict tables as Markdown rows whose cells are the printed
    ones (markup dropped, right-aligned numbers), so a README quotes them instead of retyping them."""
    tasks = {"a": 1.0, "b": 0.0}
    results = [ArmResult(arm, s, test_acc=0.5, curve=_curve(arm, at + 10 * s), budget_s=1000.0, test_per_task=tasks)
               for s in (0, 1, 2) for arm, at in (("serial+library", 600.0), ("aggregate", 250.0))]
    printed, saved = registered_summary(tmp_path, results, "target = 0.5\nbudget_s = 1000\n")
    markdown = (tmp_path / "pooled" / "summary.md").read_text()
    tables = [block for block in markdown.split("\n\n") if block.startswith("| ")]
    assert len(tables) >= 5  # compare, summary, factorial, per factor, verdicts
    factorial = next(t for t in tables if "charged s to target" in t)
    header, rule, *rows = factorial.splitlines()
    assert header.startswith("| arm | seeds | reached |") and rule.startswith("|---|---:|---:|")
    (agg,) = [r.split(" | ") for r in rows if r.startswith("| aggregate |")]
    assert agg[1:3] == ["3", "3/3"] and agg[3] == "260 [250, 270]"  # RMST over the seeds' 250/260/270 s
    assert "[bold]" not in markdown and "─" not in markdown and "━" not in markdown
    assert "[bold]" not in printed and str(tmp_path) not in markdown  # markup rendered; no machine's paths
    assert "| the claim, aggregate | holds | holds against serial+library |" in markdown
    assert saved["claim"]["aggregate"]["outcome"] == "holds"


def test_a_contrast_over_fewer_seeds_than_registered_is_interim_and_decides_nothing(tmp_path: Path) -> None:
    """Pooling seed 0 (every arm) with seed 1 (only `serial+library` so far): the paired cells name the seeds they
    pair over, and with `seeds = 8` registered every verdict is an interim reading, the claim "not decided"."""
    from ecdysis.compare.factorial import factorial_report
    from ecdysis.compare.verdict import verdicts

    tasks = {"a": 1.0, "b": 0.0}
    results = [ArmResult("serial+library", s, test_acc=0.5, curve=_curve("serial+library", 600.0), budget_s=1000.0,
                         test_per_task=tasks) for s in (0, 1)]
    results.append(ArmResult("aggregate", 0, test_acc=0.5, curve=_curve("aggregate", 250.0), budget_s=1000.0,
                             test_per_task=tasks))
    report = factorial_report(results, Registration(0.5, 1000.0, seeds=8))
    (agg,) = [r for r in report.rows if r.arm == "aggregate"]
    assert agg.paired_seeds == {"serial+library": 1} and agg.seeds == 1
    decided = verdicts(report)
    (contrast,) = decided.contrasts
    assert not contrast.decided and contrast.seeds == 1 and contrast.outcome == "interim: miss"
    assert contrast.why.startswith("1 of 8 registered seeds: ")
    assert decided.claim == [("aggregate", "not decided",
                              "interim (misses against serial+library): against serial+library over 1 seed")]
    assert decided.gains["aggregation"][1].startswith("interim, 1 of 8 registered seeds: ")
    assert decided.interim_factors == {"aggregation"}
    # registered over 1 seed, the same results decide
    assert verdicts(factorial_report(results, Registration(0.5, 1000.0, seeds=1))).contrasts[0].decided
    registration = "target = 0.5\nbudget_s = 1000\nseeds = 8\n"
    printed, saved = registered_summary(tmp_path, results, registration)
    assert "interim: miss" in printed and "not decided" in printed
    assert saved["registered_seeds"] == 8 and saved["factor_gains"]["aggregation"]["decided"] is False
    assert "Not the registered protocol" not in printed
    overridden, _ = registered_summary(tmp_path, results, registration, "--target", "0.4")
    assert "Not the registered protocol" in overridden and "target 0.4 instead of the registered 0.5" in overridden
    (tmp_path / "bad.toml").write_text("target = 0.5\nseeds = 0\n")
    with pytest.raises(ValueError, match="seeds must be a whole number"):
        Registration.read(tmp_path / "bad.toml")


def test_the_paired_cells_name_their_seeds_when_fewer_than_the_rows() -> None:
    from ecdysis.compare.factorial import _paired

    e = Estimate(3.0, None, None, 1)
    assert _paired(e, 1, 2, 2) == "3.00 (1 of 2 seeds)"
    assert _paired(e, 2, 2, 2) == "3.00"
    assert _paired(None, 0, 2) == "–"


def test_the_factorial_scores_val_only_never_train() -> None:
    """A curve without val scores reaches no val target and has no AUC (its train score is never read as val)."""
    from ecdysis.compare.factorial import factorial

    curve = [CurvePoint(arm="serial", step=0, harness_id="h", val_score=None, train_score=0.75, wall_s=258.0,
                        agent_executions=0, cached_executions=0, optimizer_calls=0, optimizer_tokens=0,
                        accepted=False, charged_s=258.0)]
    (row,) = factorial([ArmResult("serial", 0, test_acc=0.5, curve=curve, budget_s=600.0)], 0.5)[0]
    assert row.reached == 0 and row.time_to_target is not None and row.time_to_target.value == 600.0
    assert row.auc is None


def test_show_names_what_each_round_decided() -> None:
    """`ecdysis show`'s rounds table: a validation cut short is undecided, never shown as a rejection."""
    from ecdysis.cli.views import round_verdict
    from ecdysis.trainer.records import RoundRecord

    base = {"round": 1, "harness_before": "h0", "harness_after": "h0", "train_score": 0.5}
    assert round_verdict(RoundRecord(**base | {"harness_after": "h1"}, candidate="h1", accepted=True)) == "accepted"
    assert round_verdict(RoundRecord(**base, candidate="h1")) == "rejected"
    cut = RoundRecord(**base, candidate="h1", decision_taken=False, stop="budget spent: wall_s 3610/3600")
    assert round_verdict(cut) == "undecided"
    assert round_verdict(RoundRecord(**base, stop="budget spent: wall_s 3610/3600")) == "stop"
    assert round_verdict(RoundRecord(**base)) == "no candidate"
