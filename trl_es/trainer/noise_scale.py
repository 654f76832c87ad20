"""The sigma of each step of a run: the configured one, its schedule, or the adaptive sigma (`core.sigma_schedule`),
with the adaptive sigma's state, which a checkpoint saves and a resume restores."""

from __future__ import annotations

import torch

from ..core.sigma_schedule import adapted_sigma, scheduled_sigma
from ..evaluation.metrics import population_diversity


class NoiseScale:
    """Sigma for each step from an `ESConfig`. Every process computes the same values: the schedule is a function of
    the step, and the adaptive sigma of the gathered rewards every process holds."""

    def __init__(self, args, adapted: float | None = None):
        self.args = args
        self.adaptive = args.sigma_target_js_diversity is not None
        self.current = adapted if adapted is not None else args.sigma  # the adaptive sigma of the next step

    def of_step(self, step: int, total_steps: int) -> float:
        """The sigma members of step `step` (0-based) of `total_steps` are drawn with."""
        args = self.args
        if self.adaptive:
            return self.current
        return scheduled_sigma(args.sigma, args.sigma_final, args.sigma_schedule, step, total_steps)

    def js_diversity(self, completion_rewards: torch.Tensor) -> float | None:
        """The step's `es/js_diversity` from its `(members, completions)` rewards: logged with several completions
        per prompt, and always measured when it steers sigma; None otherwise."""
        args = self.args
        if args.num_generations == 1 and not self.adaptive:
            return None
        return population_diversity(completion_rewards, args.num_generations, args.success_reward_threshold)

    def observe(self, js_diversity: float | None) -> None:
        """After a step with a fitness: move the adaptive sigma towards the JS diversity target."""
        if self.adaptive:
            args = self.args
            self.current = adapted_sigma(
                self.current, args.sigma, js_diversity, args.sigma_target_js_diversity, args.sigma_adaptation_rate
            )

    def state(self) -> dict:
        """What a checkpoint records: the adaptive sigma of the next step (a resume continues from it)."""
        return {"adaptive_sigma": self.current} if self.adaptive else {}

    @classmethod
    def resumed(cls, args, metadata: dict) -> NoiseScale:
        return cls(args, metadata.get("adaptive_sigma"))
