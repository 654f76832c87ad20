"""What an ES step logs, under GRPO's metric names (`reward`, `rewards/<f>/mean`, `completions/*`, `num_tokens`, the
completion table) and ES's own (`es/*`), and the `loss` ES minimises: minus the members' mean fitness."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from trl.trainer.utils import nanstd

from ..backends.base import PhaseTimer
from ..core.distributed import Evaluators, from_process
from .divergence import StepCounters
from .rollouts import completion_metrics
from .scoring import MemberCompletions, MemberScores

# `check`: the consistency checks of the steps `consistency_check_steps` picks (0 on the others); it grows with the
# master (a server check hashes it on the host), so a large model shows here what its checks cost.
PHASES = ("perturb", "generate", "reward", "update", "check")


def mean_or_none(values: list[float]) -> float | None:
    """The mean of `values`, or None (as GRPO logs a metric without values) when there are none."""
    return sum(values) / len(values) if values else None


@dataclass
class LossLog:
    """-mean fitness of each ES step of a `train` call that had a fitness: what `loss` (per log entry) and
    `train_loss` (per run) report. Steps without a fitness are left out, as GRPO's `log` leaves out NaN metrics."""

    losses: list[float] = field(default_factory=list)
    logged: int = 0  # how many of them earlier log entries covered

    def add(self, fitness: torch.Tensor) -> None:
        self.losses.append(-fitness.mean().item())

    def take_entry_loss(self) -> float | None:
        """The mean over the steps since the last log entry."""
        loss = mean_or_none(self.losses[self.logged :])
        self.logged = len(self.losses)
        return loss

    def run_loss(self) -> float | None:
        return mean_or_none(self.losses)


def log_step(
    metrics: dict[str, list],
    reward_names: list[str],
    scores: MemberScores,
    completion_rewards: torch.Tensor,
    fitness: torch.Tensor | None,
    update_norm: float,
    timer: PhaseTimer,
    counters: StepCounters,
    js_diversity: float | None,
) -> None:
    """The step's metrics; `fitness` is None for a step without one (its reward metrics are then NaN, which GRPO's
    `log` leaves out of its averages)."""
    log_rewards(metrics, reward_names, scores.rewards_per_func, completion_rewards)
    metrics["es/update_norm"].append(update_norm)
    metrics["es/skipped_steps"] = [float(counters.skipped)]  # cumulative, like num_tokens
    metrics["es/degenerate_steps"] = [float(counters.degenerate)]  # cumulative: steps without a direction
    for phase in PHASES:
        metrics[f"es/time/{phase}"].append(timer.seconds[phase])
    if fitness is None:
        return
    metrics["es/fitness/mean"].append(fitness.mean().item())
    metrics["es/fitness/std"].append(fitness.std(unbiased=False).item())
    metrics["es/fitness/min"].append(fitness.min().item())
    metrics["es/fitness/max"].append(fitness.max().item())
    if js_diversity is not None:
        metrics["es/js_diversity"].append(js_diversity)


def log_completion_lengths(
    accelerator, state, metrics: dict[str, list], end_ids: set[int], generated: MemberCompletions, training: bool
) -> None:
    """GRPO's `num_tokens` and `completions/*` over the completions of every member (`generated`: this process's) of
    every process: a completion's length counts the model's own tokens (not tool results), and it is truncated when
    it ends without an end token; only training counts its tokens into `state.num_input_tokens_seen`."""
    device = accelerator.device
    lengths = [length for member in generated.model_token_counts() for length in member]
    rows = [ids for member in generated.completion_ids for ids in member]
    lengths = accelerator.gather(torch.tensor(lengths, device=device))
    truncated = accelerator.gather(torch.tensor([not ids or ids[-1] not in end_ids for ids in rows], device=device))
    if training:
        prompt_tokens = sum(len(ids) for member in generated.prompt_ids for ids in member)
        tokens = accelerator.gather(torch.tensor([prompt_tokens], device=device)).sum()
        state.num_input_tokens_seen += int(tokens) + int(lengths.sum())
    metrics["num_tokens"] = [state.num_input_tokens_seen]
    for name, value in completion_metrics(lengths.cpu(), truncated.cpu()).items():
        metrics[name].append(value)


def log_tool_calls(accelerator, metrics: dict[str, list], generated: MemberCompletions) -> None:
    """GRPO's `tools/call_frequency` (tool calls per rollout) and `tools/failure_frequency` (failed calls per call),
    over every member's rollouts on every process."""
    rollouts = sum(len(member) for member in generated.completion_ids)
    counts = torch.tensor([generated.tool_counts.calls, generated.tool_counts.failures, rollouts])
    calls, failures, rollouts = accelerator.gather(counts.to(accelerator.device)).view(-1, 3).sum(0).tolist()
    metrics["tools/call_frequency"].append(calls / rollouts)
    metrics["tools/failure_frequency"].append(failures / calls if calls else 0.0)


def log_best_member(
    table: dict,
    accelerator,
    evaluators: Evaluators,
    reward_names: list[str],
    prompts: list,
    scores: MemberScores,
    shaped: torch.Tensor,
) -> None:
    """Fill GRPO's completion table (`log_completions`) with the step's best member (every process holds the same
    values); its "advantage" column holds that member's shaped fitness."""
    best = int(torch.argmax(shaped))
    local, evaluator = divmod(best, evaluators.count)
    own = (scores.completions[local], scores.extra_columns[local])
    best_completions, best_columns = from_process(accelerator, own, evaluators.first_process(evaluator))
    table["prompt"].extend(prompts)
    table["completion"].extend(best_completions)
    for index, name in enumerate(reward_names):
        table["rewards"][name].extend(scores.rewards_per_func[best, :, index].tolist())
    table["advantages"].extend([shaped[best].item()] * len(prompts))
    for column in sorted(best_columns):
        table["extra"][column].extend(best_columns[column])


def log_rewards(metrics: dict[str, list], reward_names: list[str], rewards_per_func, rewards) -> None:
    """GRPO's reward metrics over all the given completions: `reward`, `reward_std` (of the weighted `rewards`) and
    `rewards/<f>/mean|std` (`rewards_per_func`: the last dimension is the reward function)."""
    for index, name in enumerate(reward_names):
        metrics[f"rewards/{name}/mean"].append(torch.nanmean(rewards_per_func[..., index]).item())
        metrics[f"rewards/{name}/std"].append(nanstd(rewards_per_func[..., index].flatten()).item())
    metrics["reward"].append(torch.nanmean(rewards).item())
    metrics["reward_std"].append(nanstd(rewards.flatten()).item())
