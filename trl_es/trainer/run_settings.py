"""The settings that decide what an ES run computes: recorded in every checkpoint (a resume compares them) and listed
in the model card, from one list."""

from __future__ import annotations

from .redaction import without_secrets

# The settings that decide what a run computes from a given checkpoint: resuming with another value of any of them
# does not continue the original run. In the order the model card lists them: the method, what a member is scored
# on, the batch. (The number of processes is not one: ES gives the same weights on any. Nor are `max_steps` and
# `num_train_epochs`, which a resume usually changes on purpose; `population_batch_size` only groups members into
# calls.)
RUN_SETTINGS = (
    "population_size",
    "sigma",
    "sigma_schedule",
    "antithetic",
    "fitness_shaping",
    "normalize_fitness_per_prompt",
    "fitness_pass_at_k",
    "es_optimizer",
    "perturbation",
    "kl_anchor_beta",
    "learning_rate",
    "lr_scheduler_type",
    "lr_scheduler_kwargs",
    "warmup_steps",
    "weight_decay",
    "reward_weights",
    "noise_seed",
    "seed",
    "data_seed",
    "shuffle_dataset",
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
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
)
LOWRANK_RUN_SETTINGS = ("lowrank_rank", "lowrank_other_parameters")
KL_ANCHOR_RUN_SETTINGS = ("kl_anchor_probe_size",)
SIGMA_SCHEDULE_RUN_SETTINGS = ("sigma_final",)
ADAPTIVE_SIGMA_RUN_SETTINGS = ("sigma_target_js_diversity", "sigma_adaptation_rate")
OPTIMIZER_RUN_SETTINGS = {
    "sgd": (),
    "momentum": ("es_momentum",),
    "adam": ("adam_beta1", "adam_beta2", "adam_epsilon"),
}

# The card says these in its text (the reward weights beside the reward functions), or only for the runs they apply
# to (`vllm_mode` for vLLM runs); it adds how the model was loaded, which a resume may change (its device map).
_CARD_TEXT_SETTINGS = ("reward_weights",)
_CARD_ONLY_SETTINGS = ("model_init_kwargs",)


def run_setting_names(args) -> tuple[str, ...]:
    """`RUN_SETTINGS`, and the low-rank ones for a low-rank run, the anchor's probe for an anchored one, the
    optimizer's constants for its optimizer, the sigma schedule's end or the adaptive sigma's target where used."""
    lowrank = LOWRANK_RUN_SETTINGS if args.perturbation == "lowrank" else ()
    anchor = KL_ANCHOR_RUN_SETTINGS if args.kl_anchor_beta else ()
    schedule = SIGMA_SCHEDULE_RUN_SETTINGS if args.sigma_schedule != "constant" else ()
    adaptive = ADAPTIVE_SIGMA_RUN_SETTINGS if args.sigma_target_js_diversity is not None else ()
    optimizer = OPTIMIZER_RUN_SETTINGS.get(args.es_optimizer, ())
    return RUN_SETTINGS + schedule + adaptive + lowrank + anchor + optimizer


def card_setting_names(args) -> tuple[str, ...]:
    """The settings of the model card's table, in order: the run settings and how the model was loaded."""
    names = [name for name in run_setting_names(args) if name not in _CARD_TEXT_SETTINGS]
    if not args.use_vllm:
        names.remove("vllm_mode")
    return (*names, *_CARD_ONLY_SETTINGS)


def run_settings(args) -> dict[str, object]:
    """The values of the run settings, JSON-ready, as a checkpoint records them: a secret inside one (an API key in
    `generation_kwargs`) as a placeholder, since checkpoints are pushed (`hub_strategy="checkpoint"`)."""
    return {name: without_secrets(_json_value(getattr(args, name))) for name in run_setting_names(args)}


def changed_run_settings(saved: dict, args) -> dict[str, tuple[object, object]]:
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
