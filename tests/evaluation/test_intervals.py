"""Bootstrap intervals and the paired sign-flip test against hand computations."""

import math

import numpy as np
import pytest

from trl_es.evaluation.intervals import (
    Interval,
    bootstrap_interval,
    bootstrap_means,
    paired_interval,
    sign_flip_p_value,
)


def test_a_constant_has_a_zero_width_interval():
    found = bootstrap_interval([0.25] * 7, draws=200)
    assert (found.mean, found.se, found.low, found.high) == (0.25, 0.0, 0.25, 0.25)


def test_two_problems_give_the_binomial_bootstrap_by_hand():
    # Resampling [0, 1] twice: mean 0, 1/2 or 1 with probabilities 1/4, 1/2, 1/4; standard error sqrt(1/4 / 2).
    means = bootstrap_means([0.0, 1.0], draws=20_000, seed=3)
    assert set(np.unique(means)) == {0.0, 0.5, 1.0}
    assert np.mean(means == 0.5) == pytest.approx(0.5, abs=0.02)
    found = bootstrap_interval([0.0, 1.0], draws=20_000, seed=3)
    assert found.mean == 0.5 and found.se == pytest.approx(math.sqrt(0.125), abs=0.01)
    assert (found.low, found.high) == (0.0, 1.0)


def test_the_interval_of_many_problems_is_the_normal_one():
    values = np.array([1.0] * 30 + [0.0] * 70)  # p = 0.3 over 100 problems: se sqrt(0.3 * 0.7 / 100) = 0.0458
    found = bootstrap_interval(values, draws=10_000)
    assert found.se == pytest.approx(math.sqrt(0.21 / 100), rel=0.05)
    assert found.low == pytest.approx(0.3 - 1.96 * 0.0458, abs=0.015)
    assert found.high == pytest.approx(0.3 + 1.96 * 0.0458, abs=0.015)


def test_the_bootstrap_repeats_with_its_seed():
    values = np.linspace(0, 1, 37)
    assert np.array_equal(bootstrap_means(values, 2500, seed=5), bootstrap_means(values, 2500, seed=5))
    assert not np.array_equal(bootstrap_means(values, 2500, seed=5), bootstrap_means(values, 2500, seed=6))


def test_resampling_runs_too_shows_runs_that_disagree():
    # Two runs that disagree on every problem: over problems alone each run is certain, over runs it is not.
    values = np.array([[1.0] * 50, [0.0] * 50])
    assert bootstrap_interval(values[0], draws=1000).se == 0
    assert bootstrap_interval(values, draws=1000).se > 0.2


def test_identical_measurements_differ_by_exactly_zero_with_p_one():
    values = np.random.default_rng(0).random(40)
    found = paired_interval(values, values, draws=500)
    assert (found.mean, found.low, found.high) == (0.0, 0.0, 0.0)
    assert sign_flip_p_value(values - values) == 1.0


def test_pairing_cancels_what_the_problems_share():
    difficulty = np.random.default_rng(1).random(200)
    base, tuned = difficulty, difficulty + 0.05  # a small gain on problems of very different difficulty
    paired = paired_interval(tuned, base, draws=2000)
    assert (paired.mean, paired.low, paired.high) == pytest.approx((0.05, 0.05, 0.05))
    unpaired = bootstrap_interval(tuned, draws=2000)
    assert unpaired.high - unpaired.low > 0.05  # each checkpoint's own interval is wider than the gain


def test_pairing_values_of_different_shapes_is_refused():
    with pytest.raises(ValueError, match=r"shape \(3,\) with a base's of shape \(4,\)"):
        paired_interval([1, 0, 1], [1, 0, 1, 1])


@pytest.mark.parametrize(
    "differences, expected",
    [
        ([1, 1, 1], 2 / 8),  # only +++ and --- reach |sum| = 3
        ([1, 1, 1, 0, 0], 2 / 8),  # problems with no difference flip to themselves
        ([2, 1], 2 / 4),  # sums 3, 1, -1, -3
        ([1, 1, -1], 1.0),  # every pattern's |sum| is at least 1
        ([0.5] * 10, 2 / 1024),
    ],
)
def test_the_exact_sign_flip_p_value_by_hand(differences, expected):
    assert sign_flip_p_value(differences, draws=10_000) == pytest.approx(expected)


def test_a_large_consistent_difference_has_the_smallest_p_value_the_draws_allow():
    # 40 problems all improved: 2^40 patterns, so 10,000 random ones; none reaches the observed sum but +...+ itself.
    assert sign_flip_p_value([1.0] * 40, draws=10_000) == pytest.approx(1 / 10_001)


def test_drawn_sign_patterns_approximate_the_exact_p_value():
    differences = np.random.default_rng(2).normal(0.3, 1.0, size=15)
    exact = sign_flip_p_value(differences, draws=2**15)
    drawn = sign_flip_p_value(differences, draws=4000, seed=1)
    assert 0.01 < exact < 0.99 and drawn == pytest.approx(exact, abs=0.03)
    assert drawn == sign_flip_p_value(differences, draws=4000, seed=1)


def test_intervals_print_as_the_comparison_table_shows_them():
    assert Interval(0.4667, 0.02, 0.4312, 0.5021).format() == "0.467 [0.43, 0.50]"
    assert Interval(0.078, 0.02, 0.04, 0.11).format(signed=True) == "+0.078 [+0.04, +0.11]"
    assert Interval(0.5, 0.1, 0.3, 0.7).as_dict() == {"mean": 0.5, "se": 0.1, "ci": [0.3, 0.7]}
