"""ESConfig: GRPOConfig's fields plus the Evolution Strategies hyperparameters."""

from __future__ import annotations

import copy
import dataclasses
import math
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from trl import GRPOConfig

from ..core.fitness import FITNESS_SHAPINGS
from ..core.guards import FLOAT32_MAX, is_float32_finite
from ..core.lowrank import OTHER_PARAMETERS

PERTURBATIONS = ("full", "lowrank")

# Fields of GRPOConfig that only shape GRPO's policy-gradient loss. ES has no such loss, so setting one is a no-op
# that deserves a warning rather than silence.
GRPO_ONLY_FIELDS = (
    "beta",
    "num_iterations",
    "epsilon",
    "delta",
    "epsilon_high",
    "sapo_temperature_neg",
    "sapo_temperature_pos",
    "vespo_k_pos",
    "vespo_lambda_pos",
    "vespo_k_neg",
    "vespo_lambda_neg",
    "importance_sampling_level",
    "scale_rewards",
    "loss_type",
    "mask_truncated_completions",
    "sync_ref_model",
    "ref_model_mixup_alpha",
    "ref_model_sync_steps",
    "top_entropy_quantile",
    "entropy_coef",
    "use_adaptive_entropy",
    "entropy_coef_min",
    "entropy_coef_max",
    "entropy_coef_delta",
    "entropy_target",
    "vllm_importance_sampling_correction",
    "vllm_importance_sampling_mode",
    "vllm_importance_sampling_clip_max",
    "vllm_importance_sampling_clip_min",
    "off_policy_mask_threshold",
    "use_bias_correction_kl",
    "multi_objective_aggregation",
)

# Fields that GRPOConfig.__post_init__ fills in from others: their values are GRPO's choice, not the user's.
_DERIVED_FIELDS = ("generation_batch_size", "activation_checkpointing", "gradient_checkpointing")

# What GRPOTrainer.__init__ is shown for the GRPO-only fields under ESTrainer: GRPOConfig's defaults (beta=0: no
# reference model), except that there is no policy gradient for vLLM's importance sampling to correct.
_NEUTRAL_VALUES = {"vllm_importance_sampling_correction": False}


def _field_default(config_class: type, name: str):
    spec = config_class.__dataclass_fields__[name]
    if spec.default_factory is not dataclasses.MISSING:
        return spec.default_factory()
    return spec.default


def grpo_loss_settings(config: GRPOConfig) -> list[str]:
    """The GRPO-only fields of `config` set to another value than GRPOConfig's default, as `"name=value"`."""
    return [
        f"{name}={getattr(config, name)!r}"
        for name in GRPO_ONLY_FIELDS
        if getattr(config, name) != _field_default(GRPOConfig, name)
    ]


@contextmanager
def grpo_loss_defaults(config: GRPOConfig) -> Iterator[None]:
    """Within this context, `config`'s GRPO-only fields hold neutral values (GRPOConfig's defaults, `beta=0`); the
    user's values are restored on exit, so the config still reports them.

    `GRPOTrainer.__init__` reads these fields to build what only GRPO's loss uses (with `beta != 0`, a reference model:
    a second copy of the model; with a PEFT model, a "ref" adapter) and to warn about loss-type combinations. ES uses
    none of it, so `ESTrainer` builds its parent inside this context.
    """
    user_values = {name: getattr(config, name) for name in GRPO_ONLY_FIELDS}
    for name in GRPO_ONLY_FIELDS:
        setattr(config, name, _NEUTRAL_VALUES.get(name, _field_default(GRPOConfig, name)))
    try:
        yield
    finally:
        for name, value in user_values.items():
            setattr(config, name, value)


class _OneCompletionPerPrompt(int):
    """Stands in for `num_generations=1` while GRPOConfig validates.

    GRPOConfig rejects fewer than two completions per prompt because GRPO's advantages need a group; ES scores members,
    not completions, so one is valid. This value passes GRPO's group-size check and, like 1, divides every batch size.
    """

    def __new__(cls):
        return super().__new__(cls, 2)

    def __rmod__(self, other):
        return 0


@dataclass
class ESConfig(GRPOConfig):
    r"""
    Configuration class for the [`ESTrainer`].

    Subclasses [`~trl.GRPOConfig`], so every GRPO field (generation, vLLM, rewards, logging and
    [`~transformers.TrainingArguments`]) keeps its name and meaning. Fields that only shape GRPO's loss (`beta`,
    `epsilon`, `loss_type`, `num_iterations`, ...) are accepted and ignored, with a warning when set; the config keeps
    the values given, but `ESTrainer` builds no reference model whatever `beta` says (ES has no KL penalty).
    `steps_per_generation` (or `generation_batch_size`) other than `gradient_accumulation_steps` is converted to it,
    with a warning: ES makes one update per prompt batch.

    One ES step evaluates `population_size` perturbed copies of the model ("members") on the same prompt batch, scores
    each member by its mean reward, shapes the scores and moves the parameters by
    `learning_rate * (1/N) * sum_i z_i * eps_i`. The `1/sigma` of the gradient estimate is folded into `learning_rate`
    (Qiu et al., arXiv 2509.24372).

    Parameters:
        > Evolution Strategies

        population_size (`int`, *optional*, defaults to `30`):
            Number of perturbed members evaluated per ES step (N). Smaller populations suffice for larger models
            (N=16 is within 0.01 reward of N=64 at 1.5B/3B parameters, arXiv 2608.27351).
        sigma (`float`, *optional*, defaults to `1e-3`):
            Standard deviation of the Gaussian parameter noise.
        antithetic (`bool`, *optional*, defaults to `False`):
            Use mirrored pairs `(+eps, -eps)` (two-point estimator). Requires an even `population_size`. The source
            paper found no advantage over the one-point estimator on generated answers.
        fitness_shaping (`str`, *optional*, defaults to `"zscore"`):
            How member fitness is normalised before the update: `"zscore"` (paper), `"centered_rank"` (OpenAI ES) or
            `"none"` (mean-centred only). Equal fitness always gives a zero update.
        perturbation (`str`, *optional*, defaults to `"full"`):
            `"full"`: each member perturbs every evolving parameter with full-rank Gaussian noise. `"lowrank"`
            (EGGROLL, arXiv 2511.16652): each `nn.Linear`/`nn.Embedding` weight gets `sigma * A @ B.T / sqrt(r)`
            with `A`, `B` of rank `lowrank_rank` drawn from the member's seed, and the whole population generates in
            one batched call: with `model.generate`, forward hooks add each row's own low-rank term (the weights are
            never written); with vLLM (colocate), each member is a LoRA adapter and only the decoder's Linear
            projections evolve (set `lowrank_other_parameters="frozen"`). The update is the full-rank sum of the
            members' low-rank terms.
        lowrank_rank (`int`, *optional*, defaults to `1`):
            Rank `r` of each member's perturbation of each matrix (EGGROLL uses 1).
        lowrank_other_parameters (`str`, *optional*, defaults to `"full"`):
            What the other evolving parameters (norm weights, biases) do with `perturbation="lowrank"`: `"full"`
            gets full-rank noise as full-rank members do (norm modules are re-run per member in the batch),
            `"frozen"` keeps them fixed (neither perturbed nor updated).
        population_batch_size (`int`, *optional*):
            With `perturbation="lowrank"`: how many members generate together in one call (each call has
            `population_batch_size x` the prompt batch's rows; with vLLM it is also the engine's number of LoRA slots).
            Defaults to all of a process's members; lower it if the batch does not fit in memory.
        shard_update (`bool`, *optional*, defaults to `True`):
            With several processes, split the update's noise draws between them: each process computes the update
            direction of a share of the tensors (summing the members in the same order as one process would) and
            broadcasts it, so the weights stay bitwise the same as with one process. Each process then receives
            (P - 1)/P of the model in float32 per step; turn it off across machines whose network is slower than
            drawing `population_size` noises of the model again.
        noise_seed (`int`, *optional*):
            Seed of the members' noise and of their shared sampling seeds; `seed` when unset. `SequentialTrainer`
            gives every ES stage after the first its own, so that stages do not replay each other's members.
        consistency_check_steps (`int`, *optional*, defaults to `1`):
            Every this many steps (and at the last one), check that the copies of the weights that generation reads
            (the vLLM engine in colocate mode, the master inside a vLLM server) agree with the trainer's master, and
            raise if not. The check hashes the master (server) or sums the engine's weights (colocate); raise it on
            large models if that shows in `step_time`. 0 disables it.
        vllm_server_secret_file (`str`, *optional*):
            With `vllm_mode="server"`: the file holding the control secret of the `trl-es vllm-serve` server (it
            prints where it wrote it; mode 0600, yours). Defaults to `$TRL_ES_SERVER_SECRET` if set, else the file
            the server writes for its port, `~/.cache/trl-es/vllm-server-<port>.secret`. The secret itself never goes
            in the config (configs are logged and saved).

        > Coverage evaluation (with an `eval_dataset`)

        eval_ks (`list[int]`, *optional*):
            The k of Pass@k and Maj@k. When set, every evaluation also samples `max(eval_ks)` completions of each
            eval prompt from the centre (not a perturbed member), through vLLM when training uses it, and logs
            `eval_pass@k`, `eval_maj@k`, `eval_greedy_accuracy` and `eval_entropy` (mean token entropy, nats).
        eval_temperature (`float`, *optional*, defaults to `1.0`):
            Sampling temperature of those completions (greedy accuracy is measured separately).
        eval_answer_extractor (`str`, *optional*):
            Import path of a function from completion text to answer (None when there is none), e.g.
            `"trl_es.tasks.arithmetic.extract_answer"`. A completion is then correct when its answer equals the eval
            set's `answer` column, and the answers decide Maj@k. Without it, a completion is correct when its weighted
            reward is above `success_reward_threshold`, and Maj@k is not logged.
        success_reward_threshold (`float`, *optional*, defaults to `0.0`):
            A completion whose weighted reward is above this counts as a success: in `es/js_diversity` and, without
            `eval_answer_extractor`, in the coverage evaluation.

        > Fields whose defaults differ from [`~trl.GRPOConfig`]

        learning_rate (`float`, *optional*, defaults to `5e-4`):
            ES step size alpha (= sigma / 2 in the anchor paper). The scheduler in `lr_scheduler_type` applies to it.
        lr_scheduler_type (`str`, *optional*, defaults to `"constant"`):
            The anchor paper keeps alpha constant.
        num_generations (`int`, *optional*, defaults to `1`):
            Completions per prompt for each member. More than one only makes sense with `temperature > 0`.
        temperature (`float`, *optional*, defaults to `0.0`):
            Sampling temperature; `0.0` decodes greedily (the anchor paper's choice). With sampling, all members of a
            step share the same sampling seeds (common random numbers), so fitness differences come from the
            parameters rather than from sampling luck.
        disable_dropout (`bool`, *optional*, defaults to `True`):
            Dropout would add noise unrelated to the perturbation to every member's fitness.
        activation_checkpointing (`bool`, *optional*, defaults to `False`):
            ES has no backward pass, so there is nothing to checkpoint (TRL turns it on for GRPO).
        bf16 (`bool`, *optional*, defaults to `False`):
            Mixed precision has no effect on ES (no backward pass). Members generate in the model's dtype: pass
            `model_init_kwargs={"dtype": "bfloat16"}` for bf16 generation; the float32 master keeps the update exact.
    """

    population_size: int = field(
        default=30,
        metadata={"help": "Number of perturbed members evaluated per ES step (N)."},
    )
    sigma: float = field(
        default=1e-3,
        metadata={"help": "Standard deviation of the Gaussian parameter noise."},
    )
    antithetic: bool = field(
        default=False,
        metadata={"help": "Use mirrored noise pairs (+eps, -eps), the two-point estimator. Needs an even population."},
    )
    fitness_shaping: str = field(
        default="zscore",
        metadata={
            "help": "How member fitness is normalised before the update.",
            "choices": list(FITNESS_SHAPINGS),
        },
    )
    perturbation: str = field(
        default="full",
        metadata={"help": "Member noise: full-rank, or low-rank (EGGROLL) matrices.", "choices": list(PERTURBATIONS)},
    )
    lowrank_rank: int = field(
        default=1,
        metadata={"help": "Rank of each member's perturbation of each matrix with perturbation='lowrank'."},
    )
    lowrank_other_parameters: str = field(
        default="full",
        metadata={
            "help": "With perturbation='lowrank': full-rank noise for norms and biases, or keep them frozen.",
            "choices": list(OTHER_PARAMETERS),
        },
    )
    population_batch_size: int | None = field(
        default=None,
        metadata={"help": "Low-rank members generating together in one call; default: all of a process's members."},
    )

    shard_update: bool = field(
        default=True,
        metadata={
            "help": "With several processes, each computes the update of a share of the tensors and broadcasts it "
            "(bitwise the same result). Turn off where the network is slower than drawing the noise again."
        },
    )

    noise_seed: int | None = field(
        default=None,
        metadata={"help": "Seed of the members' noise and shared sampling seeds; `seed` when unset."},
    )

    consistency_check_steps: int = field(
        default=1,
        metadata={
            "help": "Every this many steps (and at the last one), check that every copy of the weights (vLLM "
            "engine or server) agrees with the master, and fail loudly if not. 0 disables the check."
        },
    )
    vllm_server_secret_file: str | None = field(
        default=None,
        metadata={
            "help": "vllm_mode='server': file with the trl-es vllm-serve control secret (default: "
            "$TRL_ES_SERVER_SECRET, else ~/.cache/trl-es/vllm-server-<port>.secret)."
        },
    )

    eval_ks: list[int] | None = field(
        default=None,
        metadata={"help": "The k of Pass@k and Maj@k logged at every evaluation (e.g. 1 4 16); unset: not measured."},
    )
    eval_temperature: float = field(
        default=1.0,
        metadata={"help": "Sampling temperature of the Pass@k / Maj@k completions."},
    )
    eval_answer_extractor: str | None = field(
        default=None,
        metadata={
            "help": "Import path of a function from completion text to answer, compared with the eval set's `answer` "
            "column. Without it, correctness is a weighted reward above `success_reward_threshold`."
        },
    )
    success_reward_threshold: float = field(
        default=0.0,
        metadata={"help": "A completion whose weighted reward is above this counts as a success."},
    )

    # Defaults that differ from GRPOConfig
    learning_rate: float = field(
        default=5e-4,
        metadata={"help": "ES step size alpha (the 1/sigma of the gradient estimate is folded in)."},
    )
    lr_scheduler_type: str = field(
        default="constant",
        metadata={"help": "Schedule of the ES step size; the anchor paper keeps it constant."},
    )
    num_generations: int | None = field(
        default=1,
        metadata={"help": "Completions per prompt for each member; more than one needs temperature > 0."},
    )
    temperature: float = field(
        default=0.0,
        metadata={"help": "Sampling temperature; 0.0 decodes greedily (the anchor paper's choice)."},
    )
    disable_dropout: bool = field(
        default=True,
        metadata={"help": "Disable dropout, which would add noise unrelated to the perturbation to every fitness."},
    )
    activation_checkpointing: bool | None = field(
        default=False,
        metadata={"help": "ES has no backward pass, so activation checkpointing only slows generation down."},
    )
    gradient_checkpointing: bool | None = field(
        default=None,
        metadata={"help": "Deprecated alias of `activation_checkpointing` (transformers v5)."},
    )
    bf16: bool | None = field(
        default=False,
        metadata={
            "help": "Mixed precision has no effect on ES, which runs no backward pass; choose the precision members "
            "generate in with `model_init_kwargs={'dtype': 'bfloat16'}`."
        },
    )

    # transformers pickles the whole config into `training_args.bin` at every save, and pushes it with the model:
    # the pickle leaves the Hub token out. Copies keep it (`copy.copy` would otherwise go through the pickle state).
    def __getstate__(self) -> dict:
        return {**self.__dict__, "hub_token": None}

    def __copy__(self) -> ESConfig:
        copied = object.__new__(type(self))
        copied.__dict__.update(self.__dict__)
        return copied

    def __deepcopy__(self, memo: dict) -> ESConfig:
        copied = object.__new__(type(self))
        memo[id(self)] = copied
        copied.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return copied

    def __post_init__(self):
        self._check_es_fields()
        self._warn_about_grpo_only_fields()
        num_generations = self.num_generations
        if num_generations == 1:
            self.num_generations = _OneCompletionPerPrompt()
        try:
            super().__post_init__()
        finally:
            self.num_generations = num_generations
        if self.steps_per_generation != self.gradient_accumulation_steps:
            self._one_prompt_batch_per_update()

    def _one_prompt_batch_per_update(self):
        """GRPO can generate once for several optimizer steps (`steps_per_generation` > `gradient_accumulation_steps`,
        or the `generation_batch_size` that implies it); ES makes one update per prompt batch, so it generates once
        per step, on the batch that `gradient_accumulation_steps` gives."""
        asked = (
            f"steps_per_generation={self.steps_per_generation} (generation_batch_size={self.generation_batch_size})"
        )
        self.steps_per_generation = self.gradient_accumulation_steps
        self.generation_batch_size = self.per_device_train_batch_size * self.world_size * self.steps_per_generation
        if self.generation_batch_size % self.num_generations:
            raise ValueError(
                f"ESTrainer makes one update per prompt batch of per_device_train_batch_size x "
                f"gradient_accumulation_steps x processes = {self.generation_batch_size} completions, which must be "
                f"divisible by num_generations ({self.num_generations}). Change per_device_train_batch_size or "
                "gradient_accumulation_steps, and leave steps_per_generation and generation_batch_size unset."
            )
        prompts = self.generation_batch_size // self.num_generations
        warnings.warn(
            f"ESTrainer makes one update per prompt batch, so {asked} becomes steps_per_generation="
            f"gradient_accumulation_steps={self.gradient_accumulation_steps}: every member of an ES step answers the "
            f"same batch of per_device_train_batch_size x gradient_accumulation_steps x processes = "
            f"{self.generation_batch_size} completions ({prompts} prompts x num_generations={self.num_generations}), "
            "drawn anew for every update. For more prompts per update, raise per_device_train_batch_size or "
            "gradient_accumulation_steps.",
            UserWarning,
            stacklevel=3,
        )

    def _check_es_fields(self):
        if not isinstance(self.population_size, int) or self.population_size < 2:
            raise ValueError(
                f"population_size must be an integer >= 2 (ES compares members), got {self.population_size!r}. "
                "The anchor papers use 16 to 30."
            )
        if self.antithetic and self.population_size % 2:
            raise ValueError(
                f"antithetic=True pairs members as (+eps, -eps), so population_size must be even; got "
                f"{self.population_size}. Use {self.population_size + 1} or set antithetic=False."
            )
        if not (isinstance(self.sigma, (int, float)) and math.isfinite(self.sigma) and self.sigma > 0):
            raise ValueError(f"sigma must be a finite number > 0, got {self.sigma!r}. The anchor paper uses 1e-3.")
        if self.fitness_shaping not in FITNESS_SHAPINGS:
            raise ValueError(
                f"Unknown fitness_shaping={self.fitness_shaping!r}; use one of {', '.join(FITNESS_SHAPINGS)}."
            )
        if self.perturbation not in PERTURBATIONS:
            raise ValueError(f"Unknown perturbation={self.perturbation!r}; use one of {', '.join(PERTURBATIONS)}.")
        if not isinstance(self.lowrank_rank, int) or self.lowrank_rank < 1:
            raise ValueError(f"lowrank_rank must be an integer >= 1, got {self.lowrank_rank!r}. EGGROLL uses 1.")
        if self.lowrank_other_parameters not in OTHER_PARAMETERS:
            raise ValueError(
                f"Unknown lowrank_other_parameters={self.lowrank_other_parameters!r}; use one of "
                f"{', '.join(OTHER_PARAMETERS)}."
            )
        if self.population_batch_size is not None and (
            not isinstance(self.population_batch_size, int) or self.population_batch_size < 1
        ):
            raise ValueError(
                f"population_batch_size must be an integer >= 1 (members per generate call), got "
                f"{self.population_batch_size!r}. Leave it unset to generate all of a process's members at once."
            )
        self._check_numbers_the_update_uses()
        self._check_seeds_and_lengths()
        if self.consistency_check_steps < 0:
            raise ValueError(
                f"consistency_check_steps must be >= 0 (0 disables the check), got {self.consistency_check_steps!r}."
            )
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 decodes greedily), got {self.temperature!r}.")
        if self.eval_ks is not None and (
            not self.eval_ks or any(not isinstance(k, int) or k < 1 for k in self.eval_ks)
        ):
            raise ValueError(
                f"eval_ks must be a non-empty list of integers >= 1 (e.g. [1, 4, 16]), got {self.eval_ks!r}."
            )
        if self.eval_temperature <= 0:
            raise ValueError(
                f"eval_temperature must be > 0 (Pass@k needs sampled completions), got {self.eval_temperature!r}."
            )
        if self.num_generations is None or self.num_generations < 1:
            raise ValueError(f"num_generations must be >= 1, got {self.num_generations!r}.")
        if self.num_generations > 1 and self.temperature == 0:
            warnings.warn(
                f"num_generations={self.num_generations} with greedy decoding (temperature=0) produces "
                f"{self.num_generations} identical completions per prompt. Set temperature > 0 to sample, or "
                "num_generations=1.",
                UserWarning,
                stacklevel=3,
            )

    def _check_numbers_the_update_uses(self):
        """Every number the ES update multiplies the float32 weights by must be finite in float32 (issue 16: a NaN
        weight_decay or learning_rate=1e39 made every weight NaN, and training "succeeded")."""
        if not (isinstance(self.sigma, (int, float)) and is_float32_finite(self.sigma)):
            raise ValueError(f"sigma={self.sigma!r} overflows float32, the precision of the noise. Use e.g. 1e-3.")
        if not (isinstance(self.learning_rate, (int, float)) and is_float32_finite(self.learning_rate)) or (
            self.learning_rate < 0
        ):
            raise ValueError(
                f"learning_rate (the ES step size) must be a finite number >= 0 that float32 can hold (up to "
                f"{FLOAT32_MAX:.3g}), got {self.learning_rate!r}. The anchor paper uses 5e-4."
            )
        if not (isinstance(self.weight_decay, (int, float)) and is_float32_finite(self.weight_decay)) or (
            self.weight_decay < 0
        ):
            raise ValueError(f"weight_decay must be a finite number >= 0, got {self.weight_decay!r}. 0 disables it.")
        if self.learning_rate * self.weight_decay >= 1:
            raise ValueError(
                f"learning_rate * weight_decay = {self.learning_rate} * {self.weight_decay} >= 1: every step would "
                "multiply the weights by 1 - learning_rate * weight_decay <= 0. Lower weight_decay."
            )
        if self.learning_rate >= 1:
            warnings.warn(
                f"learning_rate={self.learning_rate} is the ES step size: every step moves each weight by about "
                "learning_rate times a unit-variance direction, which erases what a trained model knows. The anchor "
                "paper uses 5e-4.",
                UserWarning,
                stacklevel=4,
            )
        weights = self.reward_weights or []
        if any(not isinstance(w, (int, float)) or not is_float32_finite(w) for w in weights):
            raise ValueError(f"reward_weights must be finite numbers, got {self.reward_weights!r}.")

    def _check_seeds_and_lengths(self):
        """Values that transformers or numpy would only refuse once training starts."""
        for name in ("seed", "data_seed"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**32):
                raise ValueError(
                    f"{name} must be an integer in [0, 2**32 - 1] (numpy's seed range), got {value!r}. E.g. {name}=42."
                )
        if self.noise_seed is not None and (not isinstance(self.noise_seed, int) or self.noise_seed < 0):
            raise ValueError(
                f"noise_seed must be an integer >= 0 (it is hashed, so any size works), got {self.noise_seed!r}."
            )
        length = self.max_completion_length
        if length is not None and (not isinstance(length, int) or length < 1):
            raise ValueError(
                f"max_completion_length must be an integer >= 1 (tokens generated per completion), got {length!r}."
            )

    def _warn_about_grpo_only_fields(self):
        ignored = grpo_loss_settings(self)
        if ignored:
            warnings.warn(
                f"ESTrainer ignores GRPO loss settings: {', '.join(ignored)}. ES has no policy-gradient loss and no "
                "KL penalty, so no reference model is built; remove them or use GRPOTrainer.",
                UserWarning,
                stacklevel=3,
            )

    @classmethod
    def from_grpo_config(cls, grpo_config: GRPOConfig) -> ESConfig:
        """Convert a [`~trl.GRPOConfig`] so that an unmodified GRPO script runs with [`ESTrainer`].

        Every field set to a non-default value is carried over, except GRPO's loss settings (meaningless for ES) and
        `learning_rate`, which is an AdamW step size in GRPO (typically 1e-6) and would freeze ES; the ES defaults
        apply to those. A GRPO group (`num_generations > 1`) keeps GRPO's sampling temperature, since greedy decoding
        would make its completions identical.
        """
        skipped = {*GRPO_ONLY_FIELDS, *_DERIVED_FIELDS, "learning_rate"}
        overrides = {}
        for spec in dataclasses.fields(GRPOConfig):
            if not spec.init or spec.name in skipped:
                continue
            value = getattr(grpo_config, spec.name)
            if value != _field_default(GRPOConfig, spec.name):
                overrides[spec.name] = value
        if overrides.get("num_generations", 1) > 1:
            # Several completions per prompt only differ when sampled: keep GRPO's sampling temperature for them.
            overrides.setdefault("temperature", grpo_config.temperature)
        return cls(**overrides)


# The settings that decide what a run computes from a given checkpoint: resuming with another value of any of them
# does not continue the original run. (The number of processes is not one: ES gives the same weights on any. Nor are
# `max_steps` and `num_train_epochs`, which a resume usually changes on purpose; `population_batch_size` only groups
# members into calls.)
RUN_SETTINGS = (
    "seed",
    "data_seed",
    "noise_seed",
    "population_size",
    "sigma",
    "antithetic",
    "fitness_shaping",
    "reward_weights",
    "learning_rate",
    "lr_scheduler_type",
    "lr_scheduler_kwargs",
    "warmup_steps",
    "weight_decay",
    "perturbation",
    "num_generations",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "max_completion_length",
    "generation_kwargs",
    "chat_template_kwargs",
    "disable_dropout",
    "cast_lm_head_to_fp32",
    "use_vllm",
    "vllm_mode",
    "shuffle_dataset",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
)
LOWRANK_RUN_SETTINGS = ("lowrank_rank", "lowrank_other_parameters")


def run_settings(args: ESConfig) -> dict[str, object]:
    """The values of `RUN_SETTINGS` (and the low-rank ones for low-rank runs), JSON-ready, as a checkpoint records
    them."""
    names = RUN_SETTINGS + (LOWRANK_RUN_SETTINGS if args.perturbation == "lowrank" else ())
    return {name: _json_value(getattr(args, name)) for name in names}


def changed_run_settings(saved: dict, args: ESConfig) -> dict[str, tuple[object, object]]:
    """`{name: (saved value, current value)}` for every run setting a checkpoint recorded with another value than
    `args` has (settings the checkpoint did not record are not compared)."""
    current = run_settings(args)
    return {
        name: (saved[name], value)
        for name, value in current.items()
        if name in saved and _json_value(saved[name]) != value
    }


def _json_value(value):
    """Enums by their value, as JSON stores them, so saved and current settings compare equal."""
    return getattr(value, "value", value)
