"""The projection of an interim pool to the registered seeds (`compare/projection.py`), on known inputs."""

from __future__ import annotations

import random
from pathlib import Path

from ecdysis.compare.factorial import Registration
from ecdysis.compare.projection import complete_seeds, completion, project
from ecdysis.compare.results import ArmResult
from ecdysis.trainer.records import CurvePoint

ARMS = ("serial", "serial+library", "aggregate", "ecdysis")


def _point(arm: str, step: int, time: float, val: float) -> CurvePoint:
    return CurvePoint(arm=arm, step=step, harness_id=f"{arm}{step}", val_score=val, train_score=None, wall_s=time,
                      agent_executions=step, cached_executions=0, optimizer_calls=0, optimizer_tokens=0,
                      accepted=step > 0, charged_s=time)


def seed_results(seed: int, reach: dict[str, float | None]) -> list[ArmResult]:
    """One seed: each arm reaches val 0.6 at the given charged s (None: never, within the 1000 s budget); every
    arm scores the same two test tasks alike."""
    out = []
    for arm in ARMS:
        at = reach[arm]
        curve = [_point(arm, 0, 50, 0.2)] + ([_point(arm, 1, at, 0.6)] if at is not None else [])
        out.append(ArmResult(arm, seed, curve=curve, budget_s=1000.0, test_per_task={"a": 1.0, "b": 0.0}))
    return out


FAST = {"serial": None, "serial+library": None, "aggregate": 100.0, "ecdysis": 100.0}  # 10x on every seed
SAME = {arm: 500.0 for arm in ARMS}  # no arm faster than another


def test_a_completion_keeps_the_seeds_that_ran_and_draws_the_rest_from_them_with_every_arm() -> None:
    results = seed_results(3, FAST) + seed_results(7, SAME)
    done = completion(results, 6, random.Random(1))
    seeds = sorted({r.seed for r in done})
    assert seeds == list(range(6))
    for k in seeds:  # every arm of a drawn seed comes along, so each contrast stays paired
        assert sorted(r.arm for r in done if r.seed == k) == sorted(ARMS)
    assert [r.curve for r in done if r.seed == 0] == [r.curve for r in results if r.seed == 3]  # the seeds that ran
    assert [r.curve for r in done if r.seed == 1] == [r.curve for r in results if r.seed == 7]
    block = lambda rs, seed: {r.arm: r.curve for r in rs if r.seed == seed}  # noqa: E731
    ran = [block(results, 3), block(results, 7)]
    assert all(block(done, k) in ran for k in seeds[2:])  # each drawn seed is one seed's arms, never a mix


def test_a_seed_still_running_is_not_drawn_from_but_an_arm_the_rules_do_not_read_is_not_waited_for() -> None:
    partial = [r for r in seed_results(5, SAME) if r.arm == "serial"]
    assert {r.seed for r in complete_seeds(seed_results(0, FAST) + seed_results(1, FAST) + partial)} == {0, 1}
    fixed_once = [ArmResult("fixed", 0, test_per_task={"a": 1.0, "b": 0.0})]
    assert {r.seed for r in complete_seeds(seed_results(0, FAST) + seed_results(1, FAST) + fixed_once)} == {0, 1}


def test_seeds_that_all_show_the_claim_project_it_and_seeds_that_show_nothing_do_not() -> None:
    rule = Registration(0.6, 1000.0, seeds=6)
    holding = project(seed_results(0, FAST) + seed_results(1, FAST), rule, sims=20, reps=100)
    assert holding is not None and (holding.seeds_run, holding.seeds_registered) == (2, 6)
    assert holding.holds == {"aggregate vs serial": 1.0, "aggregate vs serial+library": 1.0,
                             "ecdysis vs serial": 1.0, "ecdysis vs serial+library": 1.0,
                             "the claim, aggregate": 1.0, "the claim, ecdysis": 1.0}
    assert holding.gains == {"library": 0.0, "aggregation": 1.0, "debate": 0.0}
    assert holding.defaults == {"aggregate": 1.0}  # aggregation a gain, the debate none, in every completion
    nothing = project(seed_results(0, SAME) + seed_results(1, SAME), rule, sims=20, reps=100)
    assert nothing is not None and set(nothing.holds.values()) == {0.0} and set(nothing.gains.values()) == {0.0}
    assert nothing.defaults == {"serial+library": 1.0}


def test_seeds_that_disagree_project_a_share_between_none_and_all() -> None:
    rule = Registration(0.6, 1000.0, seeds=4)
    mixed = project(seed_results(0, FAST) + seed_results(1, SAME), rule, sims=60, reps=100)
    assert mixed is not None and 0.0 < mixed.gains["aggregation"] < 1.0


def test_the_claim_is_projected_only_where_it_holds_against_every_per_failure_arm() -> None:
    """serial+library is as fast as the aggregation arms on every seed: each contrast against serial holds, the
    claim (which needs serial+library too) never does."""
    library = {**FAST, "serial+library": 100.0}
    result = project(seed_results(0, library) + seed_results(1, library), Registration(0.6, 1000.0, seeds=4),
                     sims=10, reps=100)
    assert result is not None and result.holds["aggregate vs serial"] == 1.0
    assert result.holds["aggregate vs serial+library"] == 0.0 and result.holds["the claim, aggregate"] == 0.0


def test_nothing_is_projected_when_nothing_is_interim() -> None:
    two = seed_results(0, FAST) + seed_results(1, FAST)
    assert project(two, Registration(0.6, 1000.0), sims=5) is None  # no registered number of seeds
    assert project(two, Registration(0.6, 1000.0, seeds=2), sims=5) is None  # every registered seed ran
    assert project(seed_results(0, FAST), Registration(0.6, 1000.0, seeds=8), sims=5) is None  # one seed


def test_compare_summary_project_prints_and_writes_the_projection(tmp_path: Path) -> None:
    from helpers import registered_summary

    results = seed_results(0, FAST) + seed_results(1, FAST)
    printed, saved = registered_summary(tmp_path, results, "target = 0.6\nbudget_s = 1000\nseeds = 4\n", "--project")
    assert "Projected at the registered 4 seeds, from the 2 complete ones" in " ".join(printed.split())
    assert saved["projection"]["holds"]["aggregate vs serial+library"] == 1.0
    assert saved["projection"]["gains"]["debate"] == 0.0
    printed, saved = registered_summary(tmp_path, results, "target = 0.6\nbudget_s = 1000\n", "--project")
    assert "--project: nothing to project" in " ".join(printed.split()) and "projection" not in saved
    from typer.testing import CliRunner

    from ecdysis.cli.main import app

    out = CliRunner().invoke(app, ["compare-summary", str(tmp_path / "cmp"), "--project"], terminal_width=300)
    assert out.exit_code == 0 and "--project needs a registration" in " ".join(out.output.split()), out.output
