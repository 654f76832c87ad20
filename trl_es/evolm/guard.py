"""The reward-hacking guard of a self-rewarded phase: a verified probe that stops the run, or rolls the phase back,
when the judge's reward rises while the probe's accuracy falls.

A self-rewarded phase cannot see that it is being gamed: the judge's reward is all it has. The coverage and rubric
labs saw exactly this (GRPO phases whose reward rose while held-out accuracy collapsed). The guard measures the
phase's model on held-out questions with an evaluation-only verifier (its figures never reach a reward) every
`every` steps, and compares the reward the phase logged with the one it logged first.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, TrainerCallback

ACTIONS = ("stop", "rollback")
GUARD_FILE = "guard.json"

logger = logging.getLogger(__name__)


class RewardHackingError(RuntimeError):
    """A phase's judge reward rose while its verified probe's accuracy fell: the judge is being gamed."""


class RewardHackingGuard(TrainerCallback):
    r"""
    A [`~transformers.TrainerCallback`] for one phase (an ESTrainer or a GRPOTrainer): every `every` steps it
    measures `probe(model)` (the accuracy of the phase's current model on held-out questions, by a verifier) and,
    when the phase's logged `reward` has risen above its first value while the probe's accuracy has fallen more than
    `accuracy_drop` below its value at the phase start, it acts:

    - `"stop"`: raises [`RewardHackingError`] with the figures (training stops; the run resumes from its last
      checkpoint once the judge or the rewards are fixed);
    - `"rollback"`: puts the phase's starting weights (`start_model`) back into the model and ends the phase, which
      then saves them as its result; the next phase starts from where this one started.

    Either way the figures are written to `guard.json` in the phase's folder and logged.

    Args:
        probe (`Callable[[torch.nn.Module], float]`): The phase model's accuracy on the probe questions.
        every (`int`): Probe every this many steps (and at the phase start).
        accuracy_drop (`float`): How far the accuracy may fall below its start before the guard acts.
        action (`str`): `"stop"` or `"rollback"`.
        start_model (`str`, *optional*): The weights `"rollback"` restores; by default the folder (or Hub id) the
            phase's model was loaded from, `model.config.name_or_path`, which is where a phase starts.
    """

    def __init__(
        self,
        probe: Callable[[torch.nn.Module], float],
        every: int,
        accuracy_drop: float,
        action: str = "stop",
        start_model: str | None = None,
    ):
        if action not in ACTIONS:
            raise ValueError(f"action must be one of {ACTIONS}, got {action!r}.")
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be an integer >= 1 (steps between probes), got {every!r}.")
        self.probe, self.every, self.accuracy_drop = probe, every, accuracy_drop
        self.action, self.start_model = action, start_model
        self.start_accuracy: float | None = None
        self.probes: list[dict] = []

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.phase_start = self.start_model or model.config.name_or_path
        self.start_accuracy = self.probe(model)
        self.probes = [{"step": state.global_step, "accuracy": self.start_accuracy, "reward": None}]

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step % self.every:
            return
        rewards = [entry["reward"] for entry in state.log_history if entry.get("reward") is not None]
        accuracy = self.probe(model)
        self.probes.append(
            {"step": state.global_step, "accuracy": accuracy, "reward": rewards[-1] if rewards else None}
        )
        if len(rewards) < 2 or rewards[-1] <= rewards[0] or accuracy >= self.start_accuracy - self.accuracy_drop:
            return
        message = (
            f"The phase in {args.output_dir} looks gamed at step {state.global_step}: its judge reward rose from "
            f"{rewards[0]:.4f} to {rewards[-1]:.4f} while the verified probe's accuracy fell from "
            f"{self.start_accuracy:.4f} to {accuracy:.4f} (more than accuracy_drop={self.accuracy_drop})."
        )
        self._record(args.output_dir, message)
        if self.action == "stop":
            raise RewardHackingError(
                message + " Fix the judge or the rewards, then resume; or use guard_action='rollback'."
            )
        logger.warning(message + f" Rolling the phase back to {self.phase_start}.")
        _load_weights(model, self.phase_start)
        control.should_training_stop = True

    def _record(self, output_dir: str, message: str) -> None:
        report = {
            "action": self.action,
            "message": message,
            "accuracy_drop": self.accuracy_drop,
            "probes": self.probes,
        }
        path = Path(output_dir) / GUARD_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2))


@torch.no_grad()
def _load_weights(model: torch.nn.Module, folder: str) -> None:
    """Copy the weights saved in `folder` into `model`'s parameters, in place (an ES master that shares them
    follows)."""
    saved = dict(AutoModelForCausalLM.from_pretrained(folder).named_parameters())
    for name, parameter in model.named_parameters():
        parameter.copy_(saved[name].to(parameter.dtype))
