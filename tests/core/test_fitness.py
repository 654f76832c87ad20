import pytest
import torch

from trl_es.core.fitness import centered_ranks, shape_fitness, update_coefficients, zscore
from trl_es.core.noise import Member


def test_zscore_standardises():
    shaped = zscore(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    assert torch.allclose(shaped.mean(), torch.tensor(0.0), atol=1e-6)
    assert torch.allclose(shaped.std(unbiased=False), torch.tensor(1.0), atol=1e-6)


@pytest.mark.parametrize("method", ["zscore", "centered_rank", "none"])
def test_equal_fitness_gives_zeros_not_nan(method):
    shaped = shape_fitness(torch.full((5,), 0.7), method)
    assert torch.equal(shaped, torch.zeros(5))


def test_centered_ranks_span_minus_half_to_half():
    shaped = centered_ranks(torch.tensor([10.0, -3.0, 0.5, 7.0]))
    assert torch.allclose(shaped, torch.tensor([0.5, -0.5, -1 / 6, 1 / 6]))


def test_centered_ranks_average_ties():
    shaped = centered_ranks(torch.tensor([1.0, 1.0, 2.0]))
    assert torch.allclose(shaped, torch.tensor([-0.25, -0.25, 0.5]))


def test_none_shaping_only_centres():
    assert torch.allclose(shape_fitness(torch.tensor([1.0, 3.0]), "none"), torch.tensor([-1.0, 1.0]))


def test_unknown_shaping_names_the_choices():
    with pytest.raises(ValueError, match="zscore"):
        shape_fitness(torch.ones(2), "softmax")


def test_one_point_coefficients_are_z_over_n():
    members = [Member(11), Member(12), Member(13), Member(14)]
    coefficients = update_coefficients(members, torch.tensor([1.0, -1.0, 0.5, -0.5]))
    assert coefficients == {11: 0.25, 12: -0.25, 13: 0.125, 14: -0.125}


def test_antithetic_coefficient_is_half_the_difference_averaged_over_pairs():
    members = [Member(1, 1), Member(1, -1), Member(2, 1), Member(2, -1)]
    z = torch.tensor([1.5, -0.5, 0.25, 0.75])
    coefficients = update_coefficients(members, z)
    pairs = 2
    assert coefficients[1] == pytest.approx(((1.5 - (-0.5)) / 2) / pairs)
    assert coefficients[2] == pytest.approx(((0.25 - 0.75) / 2) / pairs)


def test_coefficients_reject_a_length_mismatch():
    with pytest.raises(ValueError, match="3 fitness values for 2 members"):
        update_coefficients([Member(1), Member(2)], torch.zeros(3))


def test_weighted_rewards_skip_unscored_entries_and_keep_unscored_completions_nan():
    from trl_es.core.fitness import weighted_rewards

    rewards_per_func = torch.tensor([[1.0, 2.0], [float("nan"), 3.0], [float("nan"), float("nan")]])
    rewards = weighted_rewards(rewards_per_func, torch.tensor([0.5, 2.0]))
    assert rewards[:2].tolist() == [0.5 + 4.0, 6.0]
    assert torch.isnan(rewards[2])  # no function scored it: it must not count as 0


def test_member_fitness_averages_scored_completions_and_gives_unscored_members_the_population_mean():
    from trl_es.core.fitness import member_fitness

    nan = float("nan")
    fitness = member_fitness(torch.tensor([[1.0, nan, 3.0], [nan, nan, nan], [0.0, 0.0, 4.0]]))
    assert fitness.tolist() == [2.0, pytest.approx(5 / 3), pytest.approx(4 / 3)]


def test_member_fitness_refuses_a_population_with_no_score_at_all():
    from trl_es.core.fitness import member_fitness

    with pytest.raises(ValueError, match="returned None for every completion"):
        member_fitness(torch.full((2, 3), float("nan")))
