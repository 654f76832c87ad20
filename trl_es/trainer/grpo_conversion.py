"""What GRPO's config means to ES: the fields that only shape GRPO's loss, and how a `GRPOConfig` becomes an
`ESConfig` so that an unmodified GRPO script runs after the class swap."""

from __future__ import annotations

import dataclasses

from trl import GRPOConfig

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
DERIVED_FIELDS = ("generation_batch_size", "activation_checkpointing", "gradient_checkpointing")

# What GRPOTrainer.__init__ is shown for the GRPO-only fields under ESTrainer: GRPOConfig's defaults (beta=0: no
# reference model), except that there is no policy gradient for vLLM's importance sampling to correct.
_NEUTRAL_VALUES = {"vllm_importance_sampling_correction": False}


def field_default(config_class: type, name: str):
    """The default of dataclass field `name` of `config_class`."""
    spec = config_class.__dataclass_fields__[name]
    if spec.default_factory is not dataclasses.MISSING:
        return spec.default_factory()
    return spec.default


def grpo_loss_settings(config: GRPOConfig) -> list[str]:
    """The GRPO-only fields of `config` set to another value than GRPOConfig's default, as `"name=value"`."""
    return [
        f"{name}={getattr(config, name)!r}"
        for name in GRPO_ONLY_FIELDS
        if getattr(config, name) != field_default(GRPOConfig, name)
    ]


def neutral_grpo_loss_values() -> dict[str, object]:
    """The values `GRPOTrainer.__init__` sees for GRPO's loss fields when it builds an ESTrainer's parent, so that it
    builds nothing only GRPO's loss uses (a reference model, a "ref" adapter)."""
    return {name: _NEUTRAL_VALUES.get(name, field_default(GRPOConfig, name)) for name in GRPO_ONLY_FIELDS}


def es_overrides_of(grpo_config: GRPOConfig) -> dict[str, object]:
    """The fields an `ESConfig` built from `grpo_config` takes from it: every field set to a non-default value,
    except GRPO's loss settings (meaningless for ES) and `learning_rate`, an AdamW step size in GRPO (typically
    1e-6) that would freeze ES. A GRPO group (`num_generations > 1`) keeps GRPO's sampling temperature, since greedy
    decoding would make its completions identical."""
    skipped = {*GRPO_ONLY_FIELDS, *DERIVED_FIELDS, "learning_rate"}
    overrides = {}
    for spec in dataclasses.fields(GRPOConfig):
        if not spec.init or spec.name in skipped:
            continue
        value = getattr(grpo_config, spec.name)
        if value != field_default(GRPOConfig, spec.name):
            overrides[spec.name] = value
    if overrides.get("num_generations", 1) > 1:
        overrides.setdefault("temperature", grpo_config.temperature)
    return overrides


def conversion_notes(grpo_config: GRPOConfig, es_config) -> str:
    """The warning that says what converting `grpo_config` into `es_config` changed."""
    notes = [
        f"ES defaults apply to population_size={es_config.population_size}, sigma={es_config.sigma} and the ES step "
        f"size learning_rate={es_config.learning_rate} (GRPO's learning_rate={grpo_config.learning_rate} is an AdamW "
        "step size); pass an ESConfig to choose them."
    ]
    ignored = grpo_loss_settings(grpo_config)
    if ignored:
        notes.append(
            f"GRPO's loss settings are ignored ({', '.join(ignored)}): ES has no policy-gradient loss and no KL "
            "penalty, so no reference model is built."
        )
    if es_config.num_generations > 1:
        notes.append(
            f"Each member samples num_generations={es_config.num_generations} completions per prompt at "
            f"temperature={es_config.temperature}, as GRPO samples its group (ES's own default is one greedy "
            "completion per prompt)."
        )
    return f"ESTrainer got a GRPOConfig and converted it to an ESConfig. {' '.join(notes)}"
