"""Issue 38's statistics on known inputs: time to target censored at the budget, Kaplan-Meier and the restricted
mean, AUC of the step curve, the paired bootstrap over tasks x seeds, speed-up as a ratio of restricted means, the
exact sign-flip p over seeds."""

from __future__ import annotations

import pytest

from ecdysis.compare.stats import (
    TimeToTarget,
    auc,
    kaplan_meier,
    mean_p,
    paired_estimate,
    restricted_mean,
    sign_flip_p,
    speedup_estimate,
    speedup_p,
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


def test_sign_flip_p_enumerates_every_swap_of_the_seeds() -> None:
    assert mean_p([1.0, 2.0, 3.0]) == pytest.approx(1 / 8)  # of the 8 sign patterns only the observed is as high
    assert mean_p([-1.0, -2.0]) == 1.0  # the observed is the lowest: every swap is at least it
    assert mean_p([1.0, 0.0, 0.0]) == pytest.approx(4 / 8)  # a seed with no difference swaps to the same value:
    assert mean_p([1.0, 1.0, 0.0, 0.0]) == pytest.approx(4 / 16)  # p >= 2^-(seeds that differ)
    assert mean_p([0.5]) is None and mean_p([]) is None  # nothing to swap


def test_speedup_p_counts_censored_seeds_as_uninformative() -> None:
    reference = {s: TimeToTarget(400.0, True) for s in range(3)}
    arm = {s: TimeToTarget(100.0, True) for s in range(3)}
    assert speedup_p(reference, arm, 600.0) == pytest.approx(1 / 8)  # sooner on every seed: only no swap is >=
    assert speedup_p(arm, reference, 600.0) == 1.0  # slower on every seed
    both_missed = {**reference, 3: TimeToTarget(600.0, False)}, {**arm, 3: TimeToTarget(600.0, False)}
    assert speedup_p(*both_missed, 600.0) == pytest.approx(2 / 16)  # a seed both missed swaps to itself: still 1/8
    assert speedup_p(reference, {9: TimeToTarget(1.0, True)}, 600.0) is None  # no seed in common


def test_sign_flip_p_draws_seeded_swaps_past_the_exact_limit() -> None:
    p = sign_flip_p(20, lambda swapped: float(sum(not f for f in swapped)), reps=400, seed=1)
    assert p == pytest.approx(1 / 401)  # the observed (no swap) is the one maximum among 400 random swaps
    assert p == sign_flip_p(20, lambda swapped: float(sum(not f for f in swapped)), reps=400, seed=1)
