"""Fitness shaping and update coefficients: the ES estimator as pure functions.

One ES step moves the parameters by `lr * (1/N) * sum_i z_i * sign_i * eps(seed_i)` where `z` is the shaped fitness.
The `1/sigma` of the textbook gradient estimate is folded into the learning rate, as in Qiu et al. (arXiv 2509.24372).
The antithetic (two-point) estimator needs no separate formula: a pair `(+eps, -eps)` sharing a seed contributes
`(z+ - z-) * eps`, i.e. the coefficient `(z+ - z-) / 2` averaged over the `N / 2` pairs.
"""

from __future__ import annotations

import math

import torch

from .noise import Member
from .pass_at_k import pass_at_k

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


def prompt_normalized(completion_rewards: torch.Tensor, num_generations: int) -> torch.Tensor:
    """Each prompt's rewards standardised over the population, so that a hard prompt and an easy one weigh the same
    in a member's fitness (EGGROLL normalises per prompt group): `(members, prompts * num_generations)` rewards, whose
    `num_generations` consecutive completions answer one prompt, minus the prompt's mean over every member's
    completions of it, over their (population) standard deviation. NaN (not scored) stays NaN; a prompt on which the
    population scored all the same gives zeros: it cannot tell members apart.
    """
    members, completions = completion_rewards.shape
    grouped = completion_rewards.to(torch.float32).view(members, completions // num_generations, num_generations)
    scored = ~torch.isnan(grouped)
    count = scored.sum(dim=(0, 2), keepdim=True).clamp(min=1)
    mean = grouped.nansum(dim=(0, 2), keepdim=True) / count
    centred = grouped - mean
    std = (centred.nan_to_num().pow(2).sum(dim=(0, 2), keepdim=True) / count).sqrt()
    normalized = torch.where(std > 0, centred / std.clamp(min=torch.finfo(torch.float32).tiny), 0.0)
    return torch.where(scored, normalized, torch.nan).view(members, completions)


def pass_at_k_rewards(
    completion_rewards: torch.Tensor, num_generations: int, k: int, success_threshold: float
) -> torch.Tensor:
    """`(members, prompts)`: each member's unbiased Pass@k on each prompt from its `num_generations` completions of
    it (consecutive in `(members, prompts * num_generations)` rewards), a success being a reward above
    `success_threshold`; NaN where fewer than `k` completions were scored. With it as fitness, ES climbs coverage
    itself instead of the mean reward (`ESConfig.fitness_pass_at_k`).
    """
    members, completions = completion_rewards.shape
    grouped = completion_rewards.view(members, completions // num_generations, num_generations)
    scored = (~torch.isnan(grouped)).sum(dim=2).tolist()
    successes = (grouped > success_threshold).sum(dim=2).tolist()  # NaN > x is False: unscored is no success
    return torch.tensor(
        [
            [pass_at_k(n, c, k) if n >= k else math.nan for n, c in zip(row_n, row_c, strict=True)]
            for row_n, row_c in zip(scored, successes, strict=True)
        ],
        dtype=torch.float32,
    )


def objective_rewards(
    completion_rewards: torch.Tensor,
    num_generations: int,
    pass_k: int | None = None,
    success_threshold: float = 0.0,
    normalize_prompts: bool = False,
) -> torch.Tensor:
    """What `member_fitness` averages into each member's fitness, from `(members, prompts * num_generations)`
    rewards: the rewards themselves, or with `pass_k` each prompt's Pass@k (`pass_at_k_rewards`); with
    `normalize_prompts`, standardised prompt by prompt over the population (`prompt_normalized`)."""
    if pass_k is not None:
        completion_rewards = pass_at_k_rewards(completion_rewards, num_generations, pass_k, success_threshold)
        num_generations = 1  # one value per prompt now
    if normalize_prompts:
        completion_rewards = prompt_normalized(completion_rewards, num_generations)
    return completion_rewards


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
