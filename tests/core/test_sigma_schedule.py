"""The noise scale of each step (`trl_es.core.sigma_schedule`) against hand computations."""

import math

import pytest

from trl_es.core.sigma_schedule import ADAPTIVE_SIGMA_RANGE, adapted_sigma, scheduled_sigma


def test_a_constant_schedule_or_no_final_sigma_keeps_sigma():
    assert [scheduled_sigma(0.02, 0.005, "constant", step, 5) for step in range(5)] == [0.02] * 5
    assert scheduled_sigma(0.02, None, "cosine", 3, 5) == 0.02


def test_the_linear_schedule_runs_from_sigma_at_the_first_step_to_the_final_at_the_last():
    # 5 steps: progress 0, 1/4, 1/2, 3/4, 1
    assert [scheduled_sigma(0.02, 0.004, "linear", step, 5) for step in range(5)] == pytest.approx(
        [0.02, 0.016, 0.012, 0.008, 0.004]
    )
    assert scheduled_sigma(0.02, 0.004, "linear", 9, 5) == pytest.approx(0.004)  # past the end: the final value


def test_the_cosine_schedule_follows_a_half_cosine():
    # progress 1/3: 0.004 + 0.016 * (1 + cos(pi / 3)) / 2 = 0.004 + 0.016 * 0.75
    assert scheduled_sigma(0.02, 0.004, "cosine", 1, 4) == pytest.approx(0.016)
    assert scheduled_sigma(0.02, 0.004, "cosine", 0, 4) == pytest.approx(0.02)
    assert scheduled_sigma(0.02, 0.004, "cosine", 3, 4) == pytest.approx(0.004)
    assert scheduled_sigma(0.02, 0.004, "cosine", 0, 1) == pytest.approx(0.02)  # a one-step run: its first step


def test_an_unknown_schedule_is_refused_by_name():
    with pytest.raises(ValueError, match="sigma_schedule='exponential'.*constant"):
        scheduled_sigma(0.02, 0.01, "exponential", 0, 10)


def test_the_adaptive_sigma_moves_in_proportion_to_the_relative_shortfall():
    # target 0.2, measured 0.1: shortfall +0.5, so sigma * exp(0.1 * 0.5)
    assert adapted_sigma(0.02, 0.02, 0.1, 0.2, 0.1) == pytest.approx(0.02 * math.exp(0.05))
    # measured 0.3: -0.5
    assert adapted_sigma(0.02, 0.02, 0.3, 0.2, 0.1) == pytest.approx(0.02 * math.exp(-0.05))
    assert adapted_sigma(0.02, 0.02, 0.2, 0.2, 0.1) == pytest.approx(0.02)  # on target: unchanged


def test_the_adaptive_sigma_changes_by_at_most_exp_rate_a_step():
    assert adapted_sigma(0.02, 0.02, 0.0, 0.2, 0.1) == pytest.approx(0.02 * math.exp(0.1))  # no diversity: +1
    assert adapted_sigma(0.02, 0.02, 1.0, 0.05, 0.1) == pytest.approx(0.02 * math.exp(-0.1))  # 19x over: clipped


def test_the_adaptive_sigma_stays_within_its_range_of_the_configured_sigma():
    high = 0.02 * ADAPTIVE_SIGMA_RANGE
    assert adapted_sigma(high, 0.02, 0.0, 0.2, 0.5) == pytest.approx(high)
    low = 0.02 / ADAPTIVE_SIGMA_RANGE
    assert adapted_sigma(low, 0.02, 1.0, 0.2, 0.5) == pytest.approx(low)


def test_a_step_without_a_diversity_leaves_the_adaptive_sigma():
    assert adapted_sigma(0.03, 0.02, math.nan, 0.2, 0.1) == 0.03
