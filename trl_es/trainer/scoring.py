"""Scoring members: each member's completions go through GRPO's own reward code (reward models, async functions,
dataset columns, environments, `trainer_state`, `log_metric`, `log_extra`, the gather across processes), one call per
member."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import torch

from ..agents.tool_calls import ToolCounts
from ..backends.base import PhaseTimer
from ..compat.trl import calculate_rewards, logged_metrics, set_reward_environments, take_reward_logs
from ..core.distributed import gather_members
from ..core.noise import Member
from .rollouts import check_prompts_fit, decode_completions, tokenize_prompts, truncation_mask


@dataclass
class MemberCompletions:
    """What a group of members generated in one step, per member (`[member][row]`).

    `completions` are the messages (or texts) reward functions read; `inputs` and `prompts` the rows and prompts each
    member was scored on (a rollout function's extra fields, an environment's observation); `environments` the
    instances reward functions receive as `environments`; `tool_masks` mark the model's own tokens (1) in the
    completion ids, which also hold tool results (0).
    """

    prompts: list[list]
    prompt_ids: list[list[list[int]]]
    completion_ids: list[list[list[int]]]
    completions: list[list] | None = None
    inputs: list[list[dict]] | None = None
    environments: list[list] | None = None
    tool_masks: list[list[list[int]]] | None = None
    tool_counts: ToolCounts = field(default_factory=ToolCounts)

    @classmethod
    def of_one_turn(cls, prompts: list, prompt_ids: list[list[int]], completion_ids: list[list[list[int]]]):
        """A plain ES step's: every member answered the same prompts in one turn (decoded when scored)."""
        return cls([prompts] * len(completion_ids), [prompt_ids] * len(completion_ids), completion_ids)

    @classmethod
    def joined(cls, groups: list[MemberCompletions]) -> MemberCompletions:
        """The groups' completions, member after member (what a step logs once every group was scored)."""

        def members(name: str) -> list | None:
            values = [getattr(group, name) for group in groups]
            return None if any(value is None for value in values) else [member for value in values for member in value]

        counts = ToolCounts()
        for group in groups:
            counts += group.tool_counts
        names = ("prompts", "prompt_ids", "completion_ids", "completions", "inputs", "environments", "tool_masks")
        return cls(**{name: members(name) for name in names}, tool_counts=counts)

    def model_token_counts(self) -> list[list[int]]:
        """Tokens each completion's model generated: all of them, but tool results and template glue (GRPO's
        completion lengths)."""
        if self.tool_masks is None:
            return [[len(ids) for ids in member] for member in self.completion_ids]
        return [[sum(mask) for mask in member] for member in self.tool_masks]


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
    truncated: torch.Tensor | None = None  # `(members, completions)`: left unscored by `mask_truncated_completions`

    @classmethod
    def joined(cls, parts: list[MemberScores]) -> MemberScores:
        """The scores of consecutive rounds of members, scored group by group."""
        return cls(
            torch.cat([part.rewards_per_func for part in parts]),
            [completions for part in parts for completions in part.completions],
            [columns for part in parts for columns in part.extra_columns],
        )


def score_members(trainer, inputs: list[dict], generated: MemberCompletions) -> MemberScores:
    """Score this process's members' completions (`generated`, one entry per member) with `trainer`'s reward
    functions, one reward call per member (the batch GRPO would score), each gathering that round's rewards from every
    process. A member's completions are decoded here unless they come as messages already; its rows are `inputs`
    unless it has its own, and its environments (if any) are what reward functions receive as `environments`. What
    the functions `log_metric` is averaged over the step into the trainer's train metrics."""
    rounds, completions, columns, logged = [], [], [], defaultdict(list)
    processes, evaluators = trainer.accelerator.num_processes, trainer.evaluators
    for m, member_ids in enumerate(generated.completion_ids):
        prompts, prompt_ids = generated.prompts[m], generated.prompt_ids[m]
        member_completions = (
            generated.completions[m]
            if generated.completions is not None
            else decode_completions(trainer.processing_class, prompts, prompt_ids, member_ids)
        )
        member_inputs = generated.inputs[m] if generated.inputs is not None else inputs
        if generated.environments is not None:
            set_reward_environments(trainer, generated.environments[m])
        rewards = calculate_rewards(trainer, member_inputs, prompts, member_completions, member_ids)
        # (P x rows, funcs) -> (P, rows, funcs) -> (E, rows, funcs): the processes of an evaluator scored alike
        rounds.append(evaluators.per_evaluator(rewards.view(processes, len(prompts), -1)))
        metrics, extra_columns = take_reward_logs(trainer)
        for name, values in metrics.items():
            logged[name] += values
        completions.append(member_completions)
        columns.append(extra_columns)
    for name, values in logged.items():
        logged_metrics(trainer, "train")[name].append(sum(values) / len(values))
    return MemberScores(torch.cat(rounds), completions, columns)


def generate_and_score(
    trainer, inputs: list[dict], members: list[Member], seed: int, timer: PhaseTimer
) -> tuple[MemberCompletions, MemberScores]:
    """`trainer`'s step: this process's members' completions (`members`: the whole population) and the whole
    population's rewards. A plain step generates every member in one backend call; with agents (`tools`,
    `environment_factory`, `rollout_func`) members run their rollouts group by group, each group scored before its
    environments are reused. With `mask_truncated_completions`, a completion that ended without EOS scores nothing."""
    args, backend = trainer.args, trainer.population.backend
    local = trainer.evaluators.members(members)
    if not trainer.agents.active:
        prompts = [example["prompt"] for example in inputs]
        template, template_kwargs = trainer.chat_template, trainer.chat_template_kwargs
        prompt_ids = tokenize_prompts(trainer.processing_class, prompts, template, template_kwargs)
        check_prompts_fit(prompts, prompt_ids, args.max_completion_length, trainer.context_length)
        completion_ids = backend.generate(local, prompt_ids, trainer.sampling, seed, timer)
        generated = MemberCompletions.of_one_turn(prompts, prompt_ids, completion_ids)
        with timer("reward"):
            scores = score_members(trainer, inputs, generated)
    else:
        parts = []
        indices = {member: index for index, member in enumerate(members)}
        for group in trainer.agents.groups(backend, local):
            rollouts = trainer.agents.generate(trainer, group, [indices[m] for m in group], inputs, seed, timer)
            with timer("reward"):
                parts.append((rollouts, score_members(trainer, inputs, rollouts)))
        generated = MemberCompletions.joined([rollouts for rollouts, _ in parts])
        scores = MemberScores.joined([part for _, part in parts])
    if args.mask_truncated_completions:
        truncation = truncation_mask(generated.completion_ids, trainer.tokens)
        truncated = gather_members(trainer.accelerator, truncation, trainer.evaluators)
        scores.rewards_per_func[truncated] = float("nan")  # no fitness contribution, as no loss in GRPO
        scores.truncated = truncated
    return generated, scores
