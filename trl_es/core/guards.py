"""Divergence guards: checks that keep a non-finite number out of the master, the model and every checkpoint.

An ES step turns rewards into fitness, fitness into update coefficients, and coefficients into a step of the master.
Each stage is checked before the next one uses it, so a NaN or an infinity is caught where it enters and the error
names that place (a reward function, a setting), not the weights it would have ruined (issue 16). A reward of `None`,
or NaN, means "not scored" as in TRL; an infinite reward is refused, since no task has an infinitely good answer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping

import torch

from .tensor_chunks import largest_magnitude

FLOAT32_MAX = float(torch.finfo(torch.float32).max)


class NonFiniteError(FloatingPointError):
    """A NaN or an infinity that would have entered the master, the model or a checkpoint."""


def is_float32_finite(value: float) -> bool:
    """Whether `value` is finite once stored in float32 (`1e39` is finite in Python, infinite in float32)."""
    return math.isfinite(value) and abs(value) <= FLOAT32_MAX


def first_infinite_reward(rewards_per_func: torch.Tensor) -> tuple[int, ...] | None:
    """The index of the first `+-inf` entry of `rewards_per_func`, or None (NaN is "not scored", not infinite)."""
    infinite = torch.isinf(rewards_per_func)
    if not bool(infinite.any()):
        return None
    return tuple(int(i) for i in infinite.nonzero()[0])


def check_fitness(fitness: torch.Tensor, reward_weights: Iterable[float]) -> None:
    """Refuse member fitness that is not finite although every reward was (their weighted sum overflowed)."""
    if not bool(torch.isfinite(fitness).all()):
        raise NonFiniteError(
            f"the members' fitness {fitness.tolist()} is not finite although every reward is: the weighted rewards "
            f"(reward_weights={list(reward_weights)}) exceed float32's range ({FLOAT32_MAX:.3g}). Scale the rewards "
            "or reward_weights down."
        )


def check_update_settings(coefficients: Mapping[int, float], lr: float, weight_decay: float) -> None:
    """Refuse an update whose coefficients, step size or decay factor are not finite in float32, before any weight is
    touched."""
    bad = {seed: value for seed, value in coefficients.items() if not is_float32_finite(value)}
    if bad:
        raise NonFiniteError(
            f"the update coefficients of {len(bad)} members are not finite (e.g. {next(iter(bad.values()))}): the "
            "shaped fitness overflowed. Use fitness_shaping='zscore' or 'centered_rank', or scale the rewards down."
        )
    if not is_float32_finite(lr):
        raise NonFiniteError(f"the step size learning_rate={lr} is not finite in float32. Lower learning_rate.")
    if not (is_float32_finite(weight_decay) and is_float32_finite(lr * weight_decay)):
        raise NonFiniteError(
            f"the decay factor 1 - learning_rate * weight_decay = 1 - {lr} * {weight_decay} is not finite in float32. "
            "Set weight_decay to a finite number >= 0."
        )


def largest_finite(dtype: torch.dtype) -> float:
    """The largest magnitude `dtype` holds: a weight beyond it is infinite once written into a parameter of that dtype
    (float16 overflows at 65504, long before the float32 master does)."""
    return float(torch.finfo(dtype).max) if dtype.is_floating_point else FLOAT32_MAX


def check_step_fits(
    name: str, largest_weight: float, step: torch.Tensor, decay: float, lr: float, dtype: torch.dtype = torch.float32
) -> None:
    """Refuse the step of tensor `name` unless `master * decay + step` stays finite in float32 and in `dtype`, the
    dtype of the parameter the master is written into (issue 27: a float16 model overflowed while its float32 master
    stayed finite, and trained on for three steps with infinite weights). `largest_weight` is `max|master|`.

    The bound `|decay| * max|master| + max|step|` costs two reductions and no copy of the tensor; NaN in `step` fails
    it too. It can refuse a step whose largest entries would not have met, but only at weights near the dtype's limit.
    """
    limit = min(largest_finite(dtype), FLOAT32_MAX)
    largest = abs(decay) * largest_weight + largest_magnitude(step)
    if not largest <= limit:  # NaN fails the comparison as well
        held_in = "float32" if limit == FLOAT32_MAX else f"the parameter's {str(dtype).removeprefix('torch.')}"
        raise NonFiniteError(
            f"the update of {name!r} would make it non-finite (largest weight after the step up to {largest:.3g}, "
            f"{held_in} holds up to {limit:.3g}): learning_rate={lr} is far too large for these weights. Lower "
            "learning_rate."
        )


def first_non_finite(tensors: Mapping[str, torch.Tensor]) -> tuple[str, int] | None:
    """`(name, count)` of the first floating-point tensor holding NaN or infinity, or None when all are finite."""
    for name, tensor in tensors.items():
        # max |tensor| is finite exactly when every value is, and reading it copies nothing (the masks of a
        # 545M-element embedding take 1.1 GB); the count is made for the error alone.
        if tensor.is_floating_point() and not math.isfinite(largest_magnitude(tensor)):
            return name, int((~torch.isfinite(tensor)).sum())
    return None


def agree_on_non_finite(check: Callable[[], None], all_gather: Callable[[object], list]) -> None:
    """Run `check`, which reads and checks this process's share of something (a checkpoint's master or optimizer
    state), and raise the `NonFiniteError` that any process of `all_gather`'s group found on all of them: a process
    that raised alone would leave the others waiting in their next collective."""
    try:
        check()
        error = None
    except NonFiniteError as raised:
        error = str(raised)
    errors = [found for found in all_gather(error) if found is not None]
    if errors:
        raise NonFiniteError(errors[0])


def check_finite_tensors(tensors: Mapping[str, torch.Tensor], what: str) -> None:
    """Refuse `tensors` (described by `what`, e.g. "the weights written to checkpoint-3") if any holds NaN or inf."""
    found = first_non_finite(tensors)
    if found is not None:
        name, count = found
        raise NonFiniteError(
            f"{what} hold non-finite values: {name!r} has {count} NaN or infinite entries. Nothing non-finite is "
            "written or trained from; resume from the last checkpoint written before the values went bad."
        )
