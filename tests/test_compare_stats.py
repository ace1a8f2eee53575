"""Issue 38's statistics on known inputs: time to target censored at the budget, Kaplan-Meier and the restricted
mean, AUC of the step curve, the paired bootstrap over tasks x seeds, speed-up as a ratio of restricted means."""

from __future__ import annotations

import pytest

from ecdysis.compare.stats import (
    TimeToTarget,
    auc,
    kaplan_meier,
    paired_estimate,
    restricted_mean,
    speedup_estimate,
    time_to_target,
)


def test_time_to_target_censors_a_miss_at_the_budget() -> None:
    curve = [(10.0, 0.2), (40.0, None), (60.0, 0.5), (900.0, 0.9)]
    assert time_to_target(curve, 0.5, 600.0) == TimeToTarget(60.0, True)
    assert time_to_target(curve, 0.8, 600.0) == TimeToTarget(600.0, False)  # reached only after the budget
    assert time_to_target([(5.0, None), (6.0, 0.1)], 0.0, 100.0) == TimeToTarget(6.0, True)  # None never reaches


def test_kaplan_meier_and_the_restricted_mean_on_known_inputs() -> None:
    obs = [TimeToTarget(10.0, True), TimeToTarget(20.0, False), TimeToTarget(30.0, True)]
    assert kaplan_meier(obs) == [(10.0, pytest.approx(2 / 3)), (30.0, 0.0)]
    assert restricted_mean(obs, 100.0) == pytest.approx(10 + 20 * 2 / 3)
    misses = [TimeToTarget(10.0, True), TimeToTarget(30.0, True), TimeToTarget(100.0, False)]
    assert restricted_mean(misses, 100.0) == pytest.approx((10 + 30 + 100) / 3)  # a miss counts the budget


def test_auc_is_the_time_averaged_step_curve() -> None:
    assert auc([(0.0, 0.2), (50.0, 0.6)], 100.0) == pytest.approx((0.2 * 50 + 0.6 * 50) / 100)
    assert auc([(20.0, 0.5), (40.0, None), (200.0, 1.0)], 100.0) == pytest.approx(0.5)  # held, cut at τ
    assert auc([(0.0, None)], 100.0) is None
    assert auc([(25.0, None), (50.0, 0.6)], 100.0) is None  # the start unknown: a later score is not carried back


def test_paired_bootstrap_on_known_inputs() -> None:
    a = {0: {"x": 1.0, "y": 1.0, "z": 0.0}, 1: {"u": 1.0, "w": 0.0}}
    b = {0: {"x": 0.0, "y": 1.0, "z": 0.0, "only-b": 1.0}, 1: {"u": 0.0, "w": 0.0}, 2: {"q": 1.0}}
    e = paired_estimate(a, b, reps=500, seed=3)
    assert e is not None and e.n == 5 and e.value == pytest.approx(2 / 5)  # pairs: x, y, z, u, w
    assert e == paired_estimate(a, b, reps=500, seed=3)  # seeded: the same interval every time
    assert e.low is not None and e.high is not None and 0.0 <= e.low <= e.value <= e.high <= 1.0
    same = paired_estimate({0: {"x": 1.0, "y": 1.0}}, {0: {"x": 0.5, "y": 0.5}}, reps=200)
    assert same is not None and same.low == same.high == same.value == 0.5
    assert paired_estimate({0: {"x": 1.0}}, {1: {"x": 1.0}}) is None  # no pair in common


def test_speedup_is_a_ratio_of_restricted_means_with_misses_censored() -> None:
    serial = {0: TimeToTarget(300.0, True), 1: TimeToTarget(600.0, False)}
    arm = {0: TimeToTarget(100.0, True), 1: TimeToTarget(200.0, True)}
    e = speedup_estimate(serial, arm, 600.0, reps=300)
    assert e is not None and e.value == pytest.approx((300 + 600) / (100 + 200)) and e.n == 2
    assert e.low is not None and e.high is not None and e.low <= e.value <= e.high
