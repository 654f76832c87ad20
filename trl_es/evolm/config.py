"""EvolmConfig: how an EVOLM run alternates its phases, trains each role, samples what the phases read and weighs
the rubric phase's rewards."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

from trl import GRPOConfig

from ..trainer.es_config import ESConfig
from .diagnostics import EvalVerifier
from .guard import ACTIONS as GUARD_ACTIONS
from .pairs import SOURCES as PAIR_SOURCES
from .pairs import check_pair_sources
from .prompts import Prompts
from .rubrics import RubricRules

SCHEDULES = ("coevolve", "sequential", "static")


@dataclass
class EvolmConfig:
    r"""
    Configuration of an EVOLM run: the two roles' training configs and how the phases alternate.

    Args:
        output_dir (`str`):
            Folder of the whole run; phase `i` trains in `output_dir/stage-<i>-<policy|rubric>-<es|grpo>`.
        policy_args ([`ESConfig`] or [`~trl.GRPOConfig`]):
            Training config of every policy phase (its `max_steps` is the phase length, 50 in the paper).
        rubric_args ([`ESConfig`] or [`~trl.GRPOConfig`]):
            Training config of every rubric phase.
        schedule (`str`, *optional*, defaults to `"coevolve"`):
            `"coevolve"`: policy and rubric phases alternate, policy first. `"sequential"`: all rubric phases first,
            then all policy phases. `"static"`: policy phases only; the rubrics are the starting model's (a rubric
            generator that is never trained).
        rounds (`int`, *optional*, defaults to `2`):
            Number of policy phases (and of rubric phases, except with `"static"`).
        question_column (`str`, *optional*, defaults to `"question"`):
            The column of the training set that holds the questions (plain text).
        rubric_reward (`str`, *optional*, defaults to `"indicator"`):
            The rubric reward: `"indicator"` 1[J+ > J−] (the authors' default), `"margin"` J+ − J−, or
            `"log_sigmoid"` log σ(J+ − J−) (the paper's objective).
        pair_weights (`dict[str, float]`, *optional*, defaults to equal weights of the three sources):
            Mixture of pair sources: `"temporal"`, `"inferred"`, `"rubric_conditioned"`.
        replay_maxlen, replay_min_age, replay_max_age (`int`, *optional*, default `2048`, `20`, `100`):
            The replay buffer of (policy step, question, answer) behind temporal contrast, and the age window (in
            policy steps) of the answers it pairs with.
        max_judge_failure_rate (`float`, *optional*, defaults to `0.2`):
            A phase stops, with the figure, once more than this fraction of its judge calls failed (after at least
            32 calls).
        live_rubrics (`bool`, *optional*, defaults to `False`):
            Where a policy phase's rubrics come from: by default a snapshot, written for every question by the model
            the phase starts from (saved with the phase's dataset); with `True`, written at every step for the step's
            questions by the model being trained (the authors' way; [`LiveRubrics`]). Not with the `"static"`
            schedule, whose rubrics are the starting model's by definition.
        rubric_temperature (`float`, *optional*, defaults to `0.6`):
            Sampling temperature of the rubrics: those a policy phase reads, those rubric-conditioned pairs use, and
            those an ES rubric phase writes (its members sample them with shared seeds), so that a rubric phase
            optimises the rubrics policy phases read. 0 makes all of them greedy. The authors sample rubrics at 0.6.
        answer_temperature (`float`, *optional*, defaults to `1.0`):
            Sampling temperature of the answers generated to build the phases' datasets (the replay buffer, the
            pairs' answers). The authors' 1.0.
        inference_temperature (`float`, *optional*, defaults to `0.3`):
            Sampling temperature of the questions inferred from answers (`inferred` pairs). The authors' 0.3.
        rubric_reward_weight, format_reward_weight (`float`, *optional*, defaults to `1.0` and `0.0`):
            The weights of a rubric phase's two rewards, the discriminative one (`rubric_reward`) and the format one
            (1 for a valid rubric). The authors' code weighs format 0; a weight equal to the rubric reward's makes a
            phase mostly repair formats. Give them here, not as `rubric_args.reward_weights`.
        invalid_rubric_score (`float`, *optional*):
            The rubric reward of a completion that is not a valid rubric; by default the score of a rubric that ranks
            the pair as wrongly as possible (0 for the indicator, -1 for the margin).
        verifier ([`EvalVerifier`], *optional*):
            Ground truth for measurement only: every phase's diagnostics then add answer and rubric accuracy, the net
            signal, the pair balance and held-out accuracy, and the reward-hacking guard can run. It never reaches a
            reward, a dataset or a training step.
        guard_steps (`int`, *optional*, defaults to `0`):
            Every this many steps of a phase, the reward-hacking guard measures the phase's model on the verifier's
            held-out questions; 0 turns it off. It acts when the phase's judge reward has risen while that accuracy
            fell by more than `guard_accuracy_drop` (see [`RewardHackingGuard`]).
        guard_accuracy_drop (`float`, *optional*, defaults to `0.05`):
            How far the probe's accuracy may fall below the phase start's before the guard acts.
        guard_action (`str`, *optional*, defaults to `"stop"`):
            `"stop"`: training stops with the figures ([`RewardHackingError`]); `"rollback"`: the phase ends with the
            weights it started from.
        seed (`int`, *optional*, defaults to `42`):
            Seed of dataset building (pair sources, sampling); every ES phase also draws noise of its own.
        rubric_rules ([`RubricRules`], *optional*):
            The rubric format check.
        prompts ([`Prompts`], *optional*):
            The prompt templates.
    """

    output_dir: str
    policy_args: ESConfig | GRPOConfig
    rubric_args: ESConfig | GRPOConfig
    schedule: str = "coevolve"
    rounds: int = 2
    question_column: str = "question"
    rubric_reward: str = "indicator"
    pair_weights: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PAIR_SOURCES, 1.0))
    replay_maxlen: int = 2048
    replay_min_age: int = 20
    replay_max_age: int = 100
    max_judge_failure_rate: float = 0.2
    live_rubrics: bool = False
    rubric_temperature: float = 0.6
    answer_temperature: float = 1.0
    inference_temperature: float = 0.3
    rubric_reward_weight: float = 1.0
    format_reward_weight: float = 0.0
    invalid_rubric_score: float | None = None
    verifier: EvalVerifier | None = None
    guard_steps: int = 0
    guard_accuracy_drop: float = 0.05
    guard_action: str = "stop"
    seed: int = 42
    rubric_rules: RubricRules = field(default_factory=RubricRules)
    prompts: Prompts = field(default_factory=Prompts)

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise ValueError(f"Unknown schedule={self.schedule!r}; use one of {SCHEDULES}.")
        if not isinstance(self.rounds, int) or self.rounds < 1:
            raise ValueError(f"rounds must be an integer >= 1, got {self.rounds!r}.")
        for name in ("policy_args", "rubric_args"):
            if not isinstance(getattr(self, name), GRPOConfig):
                raise TypeError(
                    f"{name} must be an ESConfig (ES phases) or a GRPOConfig (GRPO phases), got "
                    f"{type(getattr(self, name)).__name__}."
                )
        if self.live_rubrics and self.schedule == "static":
            raise ValueError(
                "live_rubrics=True writes rubrics with the model being trained, but the 'static' schedule reads the "
                "starting model's rubrics: use schedule='coevolve' (or 'sequential'), or live_rubrics=False."
            )
        if not 0.0 <= self.max_judge_failure_rate <= 1.0:
            raise ValueError(f"max_judge_failure_rate must be in [0, 1], got {self.max_judge_failure_rate}.")
        # The first rubric phase of a `sequential` schedule comes before any policy step: no answer is old enough.
        check_pair_sources(self.pair_weights, self.schedule == "sequential")
        self._check_generation_and_rewards()
        self._check_guard()

    def _check_guard(self) -> None:
        if not isinstance(self.guard_steps, int) or self.guard_steps < 0:
            raise ValueError(f"guard_steps must be an integer >= 0 (0: no guard), got {self.guard_steps!r}.")
        if self.guard_action not in GUARD_ACTIONS:
            raise ValueError(f"guard_action must be one of {GUARD_ACTIONS}, got {self.guard_action!r}.")
        if not _is_finite_number(self.guard_accuracy_drop) or self.guard_accuracy_drop < 0:
            raise ValueError(f"guard_accuracy_drop must be a number >= 0, got {self.guard_accuracy_drop!r}.")
        if self.guard_steps and (self.verifier is None or not self.verifier.held_out_questions):
            raise ValueError(
                f"guard_steps={self.guard_steps} probes held-out questions with a verifier: pass "
                "verifier=EvalVerifier(answer_is_correct, held_out_questions=[...]), or set guard_steps=0."
            )

    def _check_generation_and_rewards(self) -> None:
        for name in ("rubric_temperature", "answer_temperature", "inference_temperature"):
            value = getattr(self, name)
            if not _is_finite_number(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0 (0 decodes greedily), got {value!r}.")
        weights = {name: getattr(self, name) for name in ("rubric_reward_weight", "format_reward_weight")}
        if not all(_is_finite_number(weight) for weight in weights.values()):
            raise ValueError(f"The rubric phase's reward weights must be finite numbers, got {weights}.")
        if not any(weights.values()):
            raise ValueError(f"The rubric phase's reward weights are all 0 ({weights}): give one a nonzero weight.")
        if self.invalid_rubric_score is not None and not _is_finite_number(self.invalid_rubric_score):
            raise ValueError(f"invalid_rubric_score must be finite, got {self.invalid_rubric_score!r}.")
        if self.rubric_args.reward_weights is not None:
            raise ValueError(
                f"rubric_args.reward_weights={self.rubric_args.reward_weights} would be replaced: a rubric phase's "
                "weights are EvolmConfig's rubric_reward_weight and format_reward_weight. Set those instead."
            )
        rubric_args = self.rubric_args
        if isinstance(rubric_args, ESConfig) and rubric_args.temperature not in (0.0, self.rubric_temperature):
            raise ValueError(
                f"An ES rubric phase samples its rubrics at rubric_temperature={self.rubric_temperature}, the "
                f"temperature policy phases read rubrics at, but rubric_args.temperature={rubric_args.temperature}. "
                "Set rubric_temperature instead (0 makes both greedy), and leave rubric_args.temperature unset."
            )

    def rubric_phase_args(self) -> ESConfig | GRPOConfig:
        """`rubric_args` as a rubric phase trains with them: the reward weights of `rubric_reward_weight` and
        `format_reward_weight`, and for ES, rubrics sampled at `rubric_temperature` (members share sampling seeds, so
        fitness differences still come from the weights)."""
        args = copy.copy(self.rubric_args)
        args.reward_weights = [self.rubric_reward_weight, self.format_reward_weight]
        if isinstance(args, ESConfig):
            args.temperature = self.rubric_temperature
        return args

    def phases(self) -> list[str]:
        """The roles of the phases in order."""
        if self.schedule == "coevolve":
            return ["policy", "rubric"] * self.rounds
        if self.schedule == "sequential":
            return ["rubric"] * self.rounds + ["policy"] * self.rounds
        return ["policy"] * self.rounds


def _is_finite_number(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
