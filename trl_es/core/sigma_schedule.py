"""The noise scale of each step, as pure functions: a schedule over the run, or a controller that holds the
population's JS diversity near a target.

The paper's theory ties Pass@K to the population's verifier-projected JS diversity (`es/js_diversity`): members that
answer alike explore nothing, members that disagree cover more. `adapted_sigma` turns that into a setting: after each
step it raises sigma when the measured diversity is below the target and lowers it when above, by at most a factor
`exp(rate)` a step, within `ADAPTIVE_SIGMA_RANGE` of the configured sigma either way.

The update's `learning_rate * mean(z_i eps_i)` folds the estimate's `1/sigma` into the learning rate, so a changing
sigma changes which members are compared, not the step's size.
"""

from __future__ import annotations

import math

SIGMA_SCHEDULES = ("constant", "linear", "cosine")
ADAPTIVE_SIGMA_RANGE = 10.0  # the adaptive sigma stays within [sigma / 10, sigma * 10]


def scheduled_sigma(sigma: float, final_sigma: float | None, schedule: str, step: int, total_steps: int) -> float:
    """Sigma of step `step` (0-based) of `total_steps`: `sigma` at the first step, `final_sigma` at the last, in
    between linearly or along a half cosine; `"constant"` (or `final_sigma=None`) is `sigma` throughout."""
    if schedule not in SIGMA_SCHEDULES:
        raise ValueError(f"sigma_schedule={schedule!r}: use one of {list(SIGMA_SCHEDULES)}.")
    if schedule == "constant" or final_sigma is None:
        return sigma
    progress = min(max(step / max(total_steps - 1, 1), 0.0), 1.0)
    if schedule == "linear":
        return sigma + (final_sigma - sigma) * progress
    return final_sigma + (sigma - final_sigma) * (1 + math.cos(math.pi * progress)) / 2


def adapted_sigma(current: float, initial: float, js_diversity: float, target: float, rate: float) -> float:
    """The next step's sigma: `current * exp(rate * clip((target - js_diversity) / target, -1, 1))`, kept within
    `ADAPTIVE_SIGMA_RANGE` of `initial`. A NaN diversity (no scored completion) leaves sigma as it is."""
    if math.isnan(js_diversity):
        return current
    error = min(max((target - js_diversity) / target, -1.0), 1.0)
    adapted = current * math.exp(rate * error)
    return min(max(adapted, initial / ADAPTIVE_SIGMA_RANGE), initial * ADAPTIVE_SIGMA_RANGE)
