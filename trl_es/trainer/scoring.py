"""Scoring members: each member's completions go through GRPO's own reward code (reward models, async functions,
dataset columns, `trainer_state`, `log_metric`, `log_extra`, the gather across processes), one call per member."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch

from ..compat.trl import calculate_rewards, logged_metrics, take_reward_logs
from .rollouts import decode_completions


@dataclass
class MemberScores:
    """The rewards of a step's population and what this process decoded.

    `rewards_per_func` is the whole population's, in member order: `(members, completions, reward functions)`, NaN
    where a function gave no score (round `j` of process `r` is member `j * P + r`). `completions` and
    `extra_columns` (the reward functions' `log_extra` columns) are this process's members', one entry per member.
    """

    rewards_per_func: torch.Tensor
    completions: list[list]
    extra_columns: list[dict[str, list]]


def score_members(
    trainer, inputs: list[dict], prompts: list, prompt_ids: list[list[int]], completion_ids: list[list[list[int]]]
) -> MemberScores:
    """Decode and score this process's members' completions (`completion_ids`, one entry per member) with
    `trainer`'s reward functions, one reward call per member (the batch GRPO would score), each gathering that
    round's rewards from every process. What the functions `log_metric` is averaged over the step into the trainer's
    train metrics."""
    rounds, completions, columns, logged = [], [], [], defaultdict(list)
    processes = trainer.accelerator.num_processes
    for member_ids in completion_ids:
        member_completions = decode_completions(trainer.processing_class, prompts, prompt_ids, member_ids)
        rewards = calculate_rewards(trainer, inputs, prompts, member_completions, member_ids)  # (P x rows, funcs)
        rounds.append(rewards.view(processes, len(prompts), -1))
        metrics, extra_columns = take_reward_logs(trainer)
        for name, values in metrics.items():
            logged[name] += values
        completions.append(member_completions)
        columns.append(extra_columns)
    for name, values in logged.items():
        logged_metrics(trainer, "train")[name].append(sum(values) / len(values))
    return MemberScores(torch.cat(rounds), completions, columns)
