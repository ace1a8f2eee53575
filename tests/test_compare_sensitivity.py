"""The post hoc target sensitivity (`compare/sensitivity.py`, `compare-summary --sensitivity`), on known inputs."""

from __future__ import annotations

from pathlib import Path

import pytest

from ecdysis.compare.results import ArmResult
from ecdysis.compare.sensitivity import at_targets, contrasts, parse_targets
from ecdysis.trainer.records import CurvePoint

TAU = 1000.0


def _point(arm: str, step: int, time: float, val: float) -> CurvePoint:
    return CurvePoint(arm=arm, step=step, harness_id=f"{arm}{step}", val_score=val, train_score=None, wall_s=time,
                      agent_executions=step, cached_executions=0, optimizer_calls=0, optimizer_tokens=0,
                      accepted=step > 0, charged_s=time)


def arm(name: str, seed: int, steps: list[tuple[float, float]]) -> ArmResult:
    """An arm whose val curve starts at 0.2 (the seed evaluation, 50 s) and then takes the given (s, val) steps."""
    curve = [_point(name, 0, 50.0, 0.2)] + [_point(name, i + 1, t, v) for i, (t, v) in enumerate(steps)]
    return ArmResult(name, seed, curve=curve, budget_s=TAU, test_per_task={"a": 1.0})


def two_seeds() -> list[ArmResult]:
    """aggregate reaches 0.4 at 100 s and 0.6 at 900 s; serial+library reaches 0.4 at 400 s and never 0.6; serial
    never gets past 0.3. The same on both seeds."""
    out = []
    for seed in (0, 1):
        out += [arm("serial", seed, [(600.0, 0.3)]), arm("serial+library", seed, [(400.0, 0.4)]),
                arm("aggregate", seed, [(100.0, 0.4), (900.0, 0.6)])]
    return out


def test_each_target_has_its_own_censored_speed_up_and_reach() -> None:
    rows = {r.target: r for r in at_targets(two_seeds(), [0.4, 0.6], TAU, reps=200)}
    low, high = rows[0.4], rows[0.6]
    assert low.reached == {"serial": (0, 2), "serial+library": (2, 2), "aggregate": (2, 2)}
    assert low.speedups["aggregate vs serial+library"].value == pytest.approx(400 / 100)
    assert low.speedups["aggregate vs serial"].value == pytest.approx(TAU / 100)  # serial censored at τ
    assert high.reached["aggregate"] == (2, 2) and high.reached["serial+library"] == (0, 2)
    assert high.speedups["aggregate vs serial+library"].value == pytest.approx(TAU / 900)
    assert high.speedups["serial+library vs serial"].value == pytest.approx(1.0)  # both censored


def test_a_target_no_arm_reaches_censors_every_arm_and_shows_no_speed_up() -> None:
    (row,) = at_targets(two_seeds(), [0.9], TAU, reps=200)
    assert all(reached == 0 for reached, _ in row.reached.values())
    assert all(e is not None and e.value == pytest.approx(1.0) for e in row.speedups.values())


def test_the_registered_target_is_marked_and_added_when_missing() -> None:
    rows = at_targets(two_seeds(), [0.4], TAU, registered=0.6, reps=50)
    assert [(r.target, r.registered) for r in rows] == [(0.4, False), (0.6, True)]
    rows = at_targets(two_seeds(), [0.6, 0.4], TAU, registered=0.6, reps=50)
    assert [(r.target, r.registered) for r in rows] == [(0.6, True), (0.4, False)]


def test_the_registered_row_is_the_factorial_tables_speed_ups() -> None:
    from ecdysis.compare.factorial import factor_rows, factorial

    results = two_seeds()
    results[1] = arm("serial+library", 0, [(300.0, 0.6)])  # the seeds now differ, so the intervals are not points
    (row,) = at_targets(results, [], TAU, registered=0.6, reps=300)
    table, tau, _ = factorial(results, 0.6, TAU, reps=300)
    agg = next(r for r in table if r.arm == "aggregate")
    for ref in ("serial", "serial+library"):
        assert row.speedups[f"aggregate vs {ref}"] == agg.speedup_vs[ref]
    library = next(f for f in factor_rows(results, 0.6, tau, reps=300) if f.factor == "library")
    assert row.speedups["serial+library vs serial"] == library.speedup


def test_contrasts_are_the_claims_then_the_factors_among_the_arms_that_ran() -> None:
    assert contrasts({"serial", "serial+library", "aggregate", "ecdysis"}) == [
        ("aggregate", "serial"), ("aggregate", "serial+library"), ("ecdysis", "serial"),
        ("ecdysis", "serial+library"), ("serial+library", "serial"), ("ecdysis", "aggregate")]
    assert contrasts({"serial", "aggregate"}) == [("aggregate", "serial")]


@pytest.mark.parametrize("text, said", [("0.4,x", "'x' is not a number"), ("1.5", "not a val accuracy"),
                                        (" , ", "no target given")])
def test_bad_targets_are_named(text: str, said: str) -> None:
    with pytest.raises(ValueError, match=said):
        parse_targets(text)
    assert parse_targets(" 0.4, 0.45 ,0.5") == [0.4, 0.45, 0.5]


def test_compare_summary_sensitivity_prints_and_writes_it(tmp_path: Path) -> None:
    from helpers import registered_summary
    from typer.testing import CliRunner

    from ecdysis.cli.main import app

    printed, saved = registered_summary(tmp_path, two_seeds(), "target = 0.6\nbudget_s = 1000\n", "--sensitivity",
                                        "0.4")
    assert "Target sensitivity (post hoc" in " ".join(printed.split())
    assert [(r["target"], r["registered"]) for r in saved["sensitivity"]] == [(0.4, False), (0.6, True)]
    assert saved["sensitivity"][0]["speedups"]["aggregate vs serial+library"]["value"] == pytest.approx(4.0)
    out = CliRunner().invoke(app, ["compare-summary", str(tmp_path / "cmp"), "--sensitivity", "0.4"],
                             terminal_width=300)
    assert out.exit_code == 0 and "--sensitivity needs a target" in " ".join(out.output.split()), out.output
    out = CliRunner().invoke(app, ["compare-summary", str(tmp_path / "cmp"), "--target", "0.6", "--sensitivity",
                                   "abc"], terminal_width=300)
    assert out.exit_code != 0 and "'abc' is not a number" in " ".join(out.output.split()), out.output
