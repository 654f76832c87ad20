"""What a reward function returns, checked where it returns it.

TRL turns a reward function's output into a tensor without looking at it first, so a function that returns a string,
a single number or None fails deep inside TRL (`'float' object is not iterable`), and NaN becomes indistinguishable
from `None` ("no score"). `ESTrainer` wraps each reward function with `checked_reward_function`: a wrong type is an
error naming the function and the value, and a tally of `None` and NaN rewards lets the trainer say which it got.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections import Counter
from collections.abc import Callable

from trl.trainer.utils import is_async_callable


def check_reward_output(name: str, output) -> None:
    """Raise `TypeError` unless `output` is a sequence of rewards, each a real number or None."""
    if output is None or isinstance(output, (str, bytes, dict)) or not hasattr(output, "__len__"):
        raise TypeError(
            f"The reward function {name!r} returned {short_repr(output)} (a {type(output).__name__}), but a reward "
            "function returns a list with one reward per completion: a number, or None for no score. E.g. "
            "`return [1.0 if is_correct(c) else 0.0 for c in completions]`."
        )
    for index, reward in enumerate(output):
        if reward is None:
            continue
        try:
            number = _as_number(reward)
        except OverflowError:  # an int beyond float range, e.g. 10**400 (issue 27: a bare OverflowError)
            raise ValueError(
                f"The reward function {name!r} returned {short_repr(reward)} for completion {index}, which is too "
                "large for a float: return rewards of a sensible scale (e.g. in [0, 1])."
            ) from None
        if number is None:
            raise TypeError(
                f"The reward function {name!r} returned {short_repr(reward)} (a {type(reward).__name__}) for "
                f"completion {index}; each reward must be a number, or None for no score."
            )


def checked_reward_function(func: Callable, name: str, tally: Counter) -> Callable:
    """`func`, with its output checked by `check_reward_output` and its `None` and NaN rewards counted in `tally`
    (keys `(name, "None")` and `(name, "NaN")`). Async functions stay async, so TRL still awaits them."""

    def check(output):
        check_reward_output(name, output)
        for reward in output:
            if reward is None:
                tally[name, "None"] += 1
            elif math.isnan(_as_number(reward)):
                tally[name, "NaN"] += 1
        return output

    if is_async_callable(func):

        @functools.wraps(func)
        async def checked_async(*args, **kwargs):
            return check(await func(*args, **kwargs))

        return checked_async

    @functools.wraps(func)
    def checked(*args, **kwargs):
        return check(func(*args, **kwargs))

    return checked


def unscored_summary(tally: Counter, names: list[str]) -> str:
    """What each function returned for completions it left unscored, when none was scored: e.g. `'f' returned None
    for every completion, 'g' returned NaN for every completion`. A function with nothing counted (a reward model,
    whose outputs are never None) gave NaN."""
    parts = []
    for name in names:
        kinds = [kind for kind in ("None", "NaN") if tally[name, kind]] or ["NaN"]
        parts.append(f"{name!r} returned {' or '.join(kinds)} for every completion")
    return ", ".join(parts)


def _as_number(value) -> float | None:
    """`value` as a float if it is a real number (Python, numpy, or a one-element tensor or array), else None."""
    if isinstance(value, numbers.Real):
        return float(value)
    item = getattr(value, "item", None)
    if callable(item):
        try:
            value = item()  # raises for more than one element
        except (ValueError, RuntimeError):
            return None
        return float(value) if isinstance(value, numbers.Real) else None
    return None


def short_repr(value) -> str:
    """`repr(value)`, cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
