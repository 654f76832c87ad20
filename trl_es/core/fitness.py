"""Fitness shaping and update coefficients: the ES estimator as pure functions.

One ES step moves the parameters by `lr * (1/N) * sum_i z_i * sign_i * eps(seed_i)` where `z` is the shaped fitness.
The `1/sigma` of the textbook gradient estimate is folded into the learning rate, as in Qiu et al. (arXiv 2509.24372).
The antithetic (two-point) estimator needs no separate formula: a pair `(+eps, -eps)` sharing a seed contributes
`(z+ - z-) * eps`, i.e. the coefficient `(z+ - z-) / 2` averaged over the `N / 2` pairs.
"""

from __future__ import annotations

import torch

from .noise import Member

FITNESS_SHAPINGS = ("zscore", "centered_rank", "none")


def weighted_rewards(rewards_per_func: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Per-completion reward `sum_f weight_f * reward_f` with TRL's semantics: NaN (`None`) entries are skipped, and a
    completion that no function scored stays NaN, so it does not count in its member's fitness.

    Args:
        rewards_per_func (`torch.Tensor`): `(..., reward functions)`, NaN where a function returned `None`.
        weights (`torch.Tensor`): `(reward functions,)`.
    """
    rewards = (rewards_per_func * weights.to(rewards_per_func.device)).nansum(dim=-1)
    rewards[torch.isnan(rewards_per_func).all(dim=-1)] = torch.nan
    return rewards


def any_scored(completion_rewards: torch.Tensor) -> bool:
    """Whether any completion of any member has a reward (NaN: not scored). A step with none has no fitness: the
    trainer skips its update, as GRPO gives unscorable completions no advantage."""
    return not bool(torch.isnan(completion_rewards).all())


def member_fitness(completion_rewards: torch.Tensor) -> torch.Tensor:
    """Mean scored reward of each member, from `(members, completions)` rewards (NaN: not scored); a member none of
    whose completions was scored gets the population mean, so it neither pulls nor pushes the update.

    Raises `ValueError` when no completion of any member was scored (see `any_scored`): there is no fitness to compare.
    """
    if not any_scored(completion_rewards):
        raise ValueError(
            "Every reward function returned None for every completion of every member, so ES has no fitness to "
            "compare. Make at least one reward function score these prompts."
        )
    fitness = torch.nanmean(completion_rewards, dim=1)
    return torch.where(torch.isnan(fitness), torch.nanmean(fitness), fitness)


def zscore(fitness: torch.Tensor) -> torch.Tensor:
    """`(f - mean) / std` (population std); all-equal fitness gives zeros instead of NaN."""
    centred = fitness - fitness.mean()
    std = fitness.std(unbiased=False)
    if not torch.isfinite(std) or std == 0:
        return torch.zeros_like(fitness)
    return centred / std


def centered_ranks(fitness: torch.Tensor) -> torch.Tensor:
    """Ranks mapped linearly onto `[-0.5, 0.5]` (OpenAI ES). Ties share their mean rank, so equal fitness gives 0."""
    n = fitness.numel()
    if n < 2:
        return torch.zeros_like(fitness)
    order = torch.argsort(fitness, stable=True)
    ranks = torch.empty_like(fitness)
    ranks[order] = torch.arange(n, dtype=fitness.dtype, device=fitness.device)
    # Average the ranks within each group of equal values.
    _, group, counts = torch.unique(fitness, return_inverse=True, return_counts=True)
    mean_ranks = torch.zeros(counts.numel(), dtype=fitness.dtype, device=fitness.device).index_add_(0, group, ranks)
    ranks = (mean_ranks / counts)[group]
    return ranks / (n - 1) - 0.5


def shape_fitness(fitness: torch.Tensor, method: str) -> torch.Tensor:
    """Shape raw member fitness with `method` (one of `FITNESS_SHAPINGS`).

    `"none"` subtracts the population mean only: a baseline that leaves the expected update unchanged and keeps the
    update at exactly zero when every member scores the same.
    """
    fitness = fitness.to(torch.float32)
    if method == "zscore":
        return zscore(fitness)
    if method == "centered_rank":
        return centered_ranks(fitness)
    if method == "none":
        return fitness - fitness.mean()
    raise ValueError(f"Unknown fitness_shaping={method!r}; use one of {FITNESS_SHAPINGS}.")


def update_coefficients(members: list[Member], shaped_fitness: torch.Tensor) -> dict[int, float]:
    """Coefficient of each noise seed in the update direction `sum_seed coef * eps(seed)`.

    Members sharing a seed (antithetic pairs) are merged, so each noise tensor is generated once per update. The
    dictionary keeps the members' order, which fixes the floating-point accumulation order on every process.
    """
    if len(members) != shaped_fitness.numel():
        raise ValueError(f"Got {shaped_fitness.numel()} fitness values for {len(members)} members.")
    coefficients: dict[int, float] = {}
    for member, z in zip(members, shaped_fitness.tolist(), strict=True):
        coefficients[member.seed] = coefficients.get(member.seed, 0.0) + member.sign * z / len(members)
    return coefficients
