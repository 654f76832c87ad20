"""The KL anchor: a penalty that holds ES members near the weights a run started from, as pure functions.

GRPO's `beta` penalises the policy's KL to a reference model on its own samples. ES has no loss to add a term to, so
the anchor enters the fitness: `fitness_i = mean reward_i - beta * KL_i`, where `KL_i` is member `i`'s KL from the
reference on a fixed probe, completions sampled once from the reference. With samples `y ~ reference`, the k3
estimator `(r - 1) - log r`, `r = member(y_t) / reference(y_t)` per token, is unbiased for KL(reference || member),
never negative, and needs only the log-probabilities of the probe's tokens (Schulman, "Approximating KL divergence",
2020; GRPO uses the same estimator). Every member reads the same probe, so the penalty's differences between members
come from their weights, not from sampling.
"""

from __future__ import annotations

import math

import torch


def token_kl(member_log_probs: torch.Tensor, reference_log_probs: torch.Tensor) -> torch.Tensor:
    """The k3 estimate of KL(reference || member) at each token the reference sampled: `(r - 1) - log r`, with
    `log r = member - reference` (log-probabilities of the same tokens, any shape)."""
    log_ratio = (member_log_probs.double() - reference_log_probs.double()).clamp(max=50.0)  # exp stays finite
    return torch.expm1(log_ratio) - log_ratio


def mean_token_kl(member_log_probs: torch.Tensor, reference_log_probs: torch.Tensor) -> float:
    """The probe's KL per token: the mean of `token_kl` over all its completion tokens."""
    if member_log_probs.shape != reference_log_probs.shape or member_log_probs.numel() == 0:
        raise ValueError(
            f"The KL probe needs log-probabilities of the same tokens: got {tuple(member_log_probs.shape)} for the "
            f"member and {tuple(reference_log_probs.shape)} for the reference."
        )
    return float(token_kl(member_log_probs, reference_log_probs).mean())


def anchored_fitness(fitness: torch.Tensor, member_kl: torch.Tensor, beta: float) -> torch.Tensor:
    """`fitness - beta * member_kl`, member by member. Raises when a KL is not finite: a member whose KL overflows
    has left the reference so far that its fitness means nothing."""
    if beta == 0:
        return fitness
    if member_kl.shape != fitness.shape:
        raise ValueError(f"One KL per member is needed: {tuple(member_kl.shape)} for fitness {tuple(fitness.shape)}.")
    if not torch.isfinite(member_kl).all():
        worst = int(torch.nonzero(~torch.isfinite(member_kl))[0])
        raise FloatingPointError(
            f"Member {worst}'s KL to the reference is {member_kl[worst].item()}: its weights are far from the "
            "reference's. Lower sigma, or the learning rate."
        )
    return fitness - beta * member_kl.to(fitness)


def check_beta(beta) -> None:
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not math.isfinite(beta) or beta < 0:
        raise ValueError(f"kl_anchor_beta must be a finite number >= 0 (0: no anchor), got {beta!r}.")
