import pytest
import torch

from trl_es.core.fitness import (
    centered_ranks,
    member_fitness,
    objective_rewards,
    pass_at_k_rewards,
    prompt_normalized,
    shape_fitness,
    update_coefficients,
    zscore,
)
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


def test_prompt_normalisation_standardises_each_prompt_over_the_population():
    # 2 members x (2 prompts x 2 generations): prompt 0 is easy (rewards near 1), prompt 1 hard (near 0)
    rewards = torch.tensor([[1.0, 0.8, 0.0, 0.2], [0.6, 1.0, 0.0, 0.0]])
    normalized = prompt_normalized(rewards, num_generations=2)
    easy, hard = torch.tensor([1.0, 0.8, 0.6, 1.0]), torch.tensor([0.0, 0.2, 0.0, 0.0])
    by_hand = [(easy - 0.85) / easy.std(unbiased=False), (hard - 0.05) / hard.std(unbiased=False)]
    assert torch.allclose(normalized[:, :2].flatten(), by_hand[0])
    assert torch.allclose(normalized[:, 2:].flatten(), by_hand[1])
    # both prompts now weigh the same: the hard prompt's 0.2 counts as much as the easy one's spread
    assert torch.allclose(normalized[:, 2:].pow(2).mean(), normalized[:, :2].pow(2).mean())


def test_prompt_normalisation_keeps_unscored_nan_and_zeroes_a_prompt_nobody_differs_on():
    rewards = torch.tensor([[1.0, torch.nan, 0.5], [1.0, 2.0, 0.0]])
    normalized = prompt_normalized(rewards, num_generations=1)
    assert torch.equal(normalized[:, 0], torch.zeros(2))  # all members scored 1: no information
    assert torch.isnan(normalized[0, 1]) and normalized[1, 1] == 0  # one scored completion: its own mean
    assert torch.allclose(normalized[:, 2], torch.tensor([1.0, -1.0]))


def test_pass_at_k_rewards_are_each_members_unbiased_pass_at_k_per_prompt():
    # 1 member, 2 prompts x 4 generations, success = reward above 0.5; prompt 0: 1 of 4 right, prompt 1: 0 of 4
    rewards = torch.tensor([[1.0, 0.0, 0.0, 0.0, 0.0, 0.2, 0.5, 0.1]])
    found = pass_at_k_rewards(rewards, num_generations=4, k=2, success_threshold=0.5)
    assert torch.allclose(found, torch.tensor([[1 - 3 / 6, 0.0]]))  # 1 - C(3,2)/C(4,2); 0.5 is not above 0.5
    assert torch.allclose(pass_at_k_rewards(rewards, 4, 1, 0.5), torch.tensor([[0.25, 0.0]]))


def test_pass_at_k_rewards_count_only_scored_completions_and_need_k_of_them():
    rewards = torch.tensor([[1.0, torch.nan, 0.0, torch.nan], [torch.nan, torch.nan, torch.nan, 1.0]])
    found = pass_at_k_rewards(rewards, num_generations=2, k=2, success_threshold=0.0)
    assert torch.isnan(found[0, 0]) and torch.isnan(found[0, 1])  # one scored completion each: no Pass@2
    assert torch.isnan(found[1, 0]) and torch.isnan(found[1, 1])
    assert torch.allclose(
        pass_at_k_rewards(rewards, 2, 1, 0.0), torch.tensor([[1.0, 0.0], [torch.nan, 1.0]]), equal_nan=True
    )


def test_the_objective_scores_pass_at_k_then_normalises_per_prompt():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    assert torch.equal(objective_rewards(rewards, 2), rewards)
    pass_2 = objective_rewards(rewards, 2, pass_k=2, success_threshold=0.5)
    assert torch.allclose(pass_2, torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]]))
    both = objective_rewards(rewards, 2, pass_k=2, success_threshold=0.5, normalize_prompts=True)
    assert torch.allclose(both, prompt_normalized(pass_2, 1))
    assert member_fitness(both).argmax() == 1  # the member that covers both prompts
