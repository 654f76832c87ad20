"""Rubrics written live, per batch, by the model being trained (the EVOLM authors' way), instead of the snapshot a
policy phase takes at its start.

A [`LiveRubrics`] callback holds the phase's model; the policy reward it wraps (`with_live_rubrics`) asks it for the
rubrics of a step's questions, which the current model writes once per step at `rubric_temperature` (an ES step
scores every member against the same rubrics, written by the centre: the trainer's model holds the centre whenever
rewards are computed). The samples are seeded by the phase and the step, so a resumed phase writes the same ones.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from transformers import TrainerCallback

from .generation import text_generator
from .prompts import render


class LiveRubrics(TrainerCallback):
    r"""
    A [`~transformers.TrainerCallback`] for a policy phase: the rubrics of each step's questions, written by the model
    being trained.

    Args:
        tokenizer: The model's tokenizer.
        rubric_prompt (`str`): The rubric-generation template (`Prompts.rubric_generation`).
        temperature (`float`): Sampling temperature of the rubrics (0: greedy).
        max_tokens (`int`): Longest rubric, in tokens.
        seed (`int`): Seed of the samples (with the phase's folder name and the step).
        as_prompt (`Callable[[str], object]`, *optional*): A text as the tokenizer reads it (a conversation with a
            chat template).
    """

    def __init__(
        self,
        tokenizer,
        rubric_prompt: str,
        temperature: float,
        max_tokens: int,
        seed: int,
        as_prompt: Callable[[str], object] = lambda text: text,
    ):
        self.tokenizer = tokenizer
        self.rubric_prompt = rubric_prompt
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.seed = seed
        self.as_prompt = as_prompt
        self.model = None
        self.phase = None
        self._step = None
        self._written: dict[str, str] = {}  # question -> rubric, this step's

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.model, self.phase = model, Path(args.output_dir).name

    def on_train_end(self, args, state, control, **kwargs):
        self.model = None

    def rubrics_for(self, questions: list[str], step: int) -> list[str]:
        """The rubric of each question at `step`, written by the current model the first time the step asks."""
        if self.model is None:
            raise RuntimeError(
                "Live rubrics are asked for outside a training phase: pass the LiveRubrics callback to the trainer "
                "whose policy reward reads them."
            )
        if step != self._step:
            self._step, self._written = step, {}
        missing = [question for question in dict.fromkeys(questions) if question not in self._written]
        if missing:
            seed_parts = (self.seed, "live-rubrics", self.phase, step, len(self._written))
            write = text_generator(
                self.model, self.tokenizer, self.max_tokens, self.temperature, seed_parts, as_prompt=self.as_prompt
            )
            texts = [render(self.rubric_prompt, question=question) for question in missing]
            self._written.update(zip(missing, write(texts), strict=True))
        return [self._written[question] for question in questions]


def with_live_rubrics(reward_function, live: LiveRubrics, question_column: str = "question"):
    """`reward_function` (a policy reward reading a `rubric` column) fed the rubrics `live` writes for the rows'
    questions at the current step."""

    def live_policy_reward(prompts, completions, trainer_state=None, **kwargs):
        kwargs["rubric"] = live.rubrics_for(list(kwargs[question_column]), trainer_state.global_step)
        return reward_function(prompts, completions, trainer_state=trainer_state, **kwargs)

    live_policy_reward.__name__ = reward_function.__name__
    return live_policy_reward
