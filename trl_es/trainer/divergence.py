"""What an ES step does when it cannot make an update: a step that would go non-finite stops training, naming the
cause and the last good checkpoint; steps without a score or without a direction are counted and warned about."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from ..core.checkpoint import last_complete_checkpoint
from ..core.distributed import Evaluators
from ..core.guards import NonFiniteError, first_infinite_reward
from .reward_checks import short_repr, unscored_summary


@dataclass
class StepCounters:
    """Steps without an update, over the whole run (checkpoints keep them; they are logged cumulatively)."""

    skipped: int = 0  # no reward function scored any completion: `es/skipped_steps`
    degenerate: int = 0  # every member equally fit, no update direction: `es/degenerate_steps`
    degenerate_streak: int = 0  # such steps in a row, up to the current one

    def count_direction(self, shaped: torch.Tensor) -> bool:
        """Count the step if its shaped fitness is all zero (no direction); True when it is the latest of a run of
        such steps in a row (`degenerate_streak`)."""
        if bool(shaped.any()):
            self.degenerate_streak = 0
            return False
        self.degenerate += 1
        self.degenerate_streak += 1
        return True


@contextmanager
def divergence_stops_training(step: int, output_dir: str) -> Iterator[None]:
    """Turn a `NonFiniteError` (its message: the cause) raised inside into the error that stops training at ES step
    `step + 1`, naming the last good checkpoint in `output_dir`. Every process raises it: they all hold the same
    rewards, fitness and update."""
    try:
        yield
    except NonFiniteError as error:
        last = last_complete_checkpoint(output_dir) if Path(output_dir).is_dir() else None
        resume = (
            f"the last good checkpoint is {last}: resume from it (resume_from_checkpoint=True) once the cause is "
            "fixed."
            if last
            else "no checkpoint was saved before it, so the run must start again once the cause is fixed."
        )
        raise NonFiniteError(
            f"ES step {step + 1} stopped training: {error} No NaN or infinity was written to the weights or a "
            f"checkpoint; {resume}"
        ) from None


def refuse_infinite_rewards(
    rewards_per_func: torch.Tensor,
    prompts: list,
    completions: list,
    reward_names: list[str],
    evaluators: Evaluators,
) -> None:
    """Raise a `NonFiniteError` naming the function and the completion of an infinite reward: it is no meaningful
    score, and it would make the fitness spread (and with it the update) NaN. NaN stays "no score", as TRL reads it.

    `rewards_per_func` is the population's `(members, completions, functions)`; `completions` this process's, per
    member (member `j * E + e` is round `j` of evaluator `e`)."""
    found = first_infinite_reward(rewards_per_func)  # (member, completion, reward function)
    if found is None:
        return
    member, row, index = found
    local_round, owner = divmod(member, evaluators.count)
    completion = f", completion {short_repr(completions[local_round][row])}" if owner == evaluators.index else ""
    raise NonFiniteError(
        f"the reward function {reward_names[index]!r} returned {rewards_per_func[found].item()} for member {member}'s "
        f"answer to prompt {row} ({short_repr(prompts[row])}{completion}). A reward must be a finite number, or None "
        "for no score; clip it in the reward function."
    )


def degenerate_steps_warning(counters: StepCounters, fitness: torch.Tensor, step: int) -> str:
    """What to say after a run of steps without an update direction, ending at ES step `step + 1`."""
    same = bool((fitness == fitness[0]).all())
    why = f"all members scored {fitness[0].item():.4g}" if same else "the fitness spread overflowed float32"
    return (
        f"The last {counters.degenerate_streak} ES steps (up to step {step + 1}) had no update direction: {why} "
        f"({counters.degenerate} such steps so far, logged as es/degenerate_steps). The reward functions do not tell "
        "the members apart: raise sigma, sample (temperature > 0) so that members answer differently, or use a "
        "reward that scores partial progress."
    )


def truncated_step_warning(counters: StepCounters, step: int, max_completion_length: int) -> str:
    """What to say about ES step `step + 1`, every completion of which ended without EOS while
    `mask_truncated_completions` leaves such completions unscored."""
    return (
        f"Step {step + 1}: every completion of every member was truncated (no EOS within max_completion_length="
        f"{max_completion_length}), and mask_truncated_completions=True scores none of them, so ES makes no update "
        f"({counters.skipped} such steps so far, logged as es/skipped_steps). Raise max_completion_length, or set "
        "mask_truncated_completions=False."
    )


def unscored_step_warning(counters: StepCounters, unscored: Counter, reward_names: list[str], step: int) -> str:
    """What to say about ES step `step + 1`, whose completions no reward function scored (GRPO gives such completions
    a zero advantage; ES has no fitness to compare and makes no update)."""
    return (
        f"Step {step + 1}: no completion of any member was scored ({unscored_summary(unscored, reward_names)}), so "
        f"ES has no fitness to compare and makes no update ({counters.skipped} such steps so far, logged as "
        "es/skipped_steps). Make at least one reward function score these prompts."
    )
