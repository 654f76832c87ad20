import pytest
import torch

from trl_es.core.distributed import in_member_order
from trl_es.core.kl_anchor import anchored_fitness, check_beta, mean_token_kl, token_kl


def test_the_estimate_is_zero_for_the_reference_itself_and_never_negative():
    log_probs = torch.log(torch.tensor([0.5, 0.25, 0.9]))
    assert torch.equal(token_kl(log_probs, log_probs), torch.zeros(3, dtype=torch.float64))
    assert (token_kl(torch.log(torch.tensor([0.1, 0.7, 0.2])), log_probs) >= 0).all()


def test_the_estimate_from_reference_samples_is_the_kl_from_the_reference():
    reference = torch.tensor([0.6, 0.3, 0.1])
    member = torch.tensor([0.2, 0.5, 0.3])
    exact = float((reference * (reference.log() - member.log())).sum())  # KL(reference || member)
    samples = torch.multinomial(reference, 200_000, replacement=True, generator=torch.Generator().manual_seed(0))
    estimate = mean_token_kl(member.log()[samples], reference.log()[samples])
    assert estimate == pytest.approx(exact, rel=0.02)


def test_log_probabilities_of_other_tokens_are_refused():
    with pytest.raises(ValueError, match=r"same tokens: got \(3,\) for the member and \(2,\)"):
        mean_token_kl(torch.zeros(3), torch.zeros(2))


def test_the_anchor_subtracts_beta_times_each_members_kl():
    fitness = torch.tensor([1.0, 1.0, 0.5])
    kl = torch.tensor([0.0, 2.0, 0.1], dtype=torch.float64)
    assert torch.allclose(anchored_fitness(fitness, kl, 0.5), torch.tensor([1.0, 0.0, 0.45]))
    assert anchored_fitness(fitness, kl, 0.0) is fitness


def test_a_member_whose_kl_is_not_finite_is_named():
    with pytest.raises(FloatingPointError, match="Member 1's KL to the reference is inf"):
        anchored_fitness(torch.zeros(2), torch.tensor([0.0, float("inf")]), 0.1)


@pytest.mark.parametrize("beta", [-0.1, float("nan"), float("inf"), "0.1", True])
def test_beta_must_be_a_finite_number_at_least_zero(beta):
    with pytest.raises(ValueError, match="kl_anchor_beta must be a finite number >= 0"):
        check_beta(beta)


def test_values_gathered_per_process_come_back_in_member_order():
    # Two processes, three rounds: process r evaluates members r, r + 2, r + 4.
    per_process = torch.tensor([[0.0, 2.0, 4.0], [1.0, 3.0, 5.0]])
    assert in_member_order(per_process).tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
