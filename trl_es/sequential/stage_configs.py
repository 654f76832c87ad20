"""The configs of an ES→GRPO or GRPO→ES run, built from one set of flags.

`trl-es es-then-grpo`, `trl-es grpo-then-es` and `examples/sequential_gsm8k.py` parse their flags (or YAML keys) as
one [`ESConfig`]:

- the ES stage uses it as is;
- the GRPO stage gets a [`~trl.GRPOConfig`] with every field that was set copied over, except the fields whose default
  or meaning ES redefines (`ES_REDEFINED_FIELDS`: the ES step size is no AdamW learning rate, ES decodes greedily with
  one completion per prompt, ...): those keep GRPOConfig's defaults;
- then `es_overrides` and `grpo_overrides` (dicts of config fields) set fields of one stage only.

The batch fields that each config's `__post_init__` derives (`generation_batch_size`, `steps_per_generation`) are
derived again for every stage, and the stages never push to the Hub themselves: the run is pushed once, with
`SequentialTrainer.push_to_hub`.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import json
import typing
import warnings
from dataclasses import dataclass, field
from typing import Any

from transformers.hf_argparser import string_to_bool
from trl import GRPOConfig

from ..trainer.es_config import ESConfig
from ..trainer.grpo_conversion import GRPO_ONLY_FIELDS, field_default
from ..trainer.redaction import SettingsWithoutSecrets

ORDERS = ("es-then-grpo", "grpo-then-es")


def _init_fields(config_class: type) -> tuple[str, ...]:
    return tuple(spec.name for spec in dataclasses.fields(config_class) if spec.init)


GRPO_FIELDS = _init_fields(GRPOConfig)
ES_FIELDS = _init_fields(ESConfig)
ES_ONLY_FIELDS = tuple(name for name in ES_FIELDS if name not in GRPO_FIELDS)

# GRPOConfig fields to which ESConfig gives another default, because their meaning or best value differs for ES (see
# ESConfig's docstring): learning_rate, lr_scheduler_type, num_generations, temperature, bf16, disable_dropout,
# gradient_checkpointing. The GRPO stage keeps GRPOConfig's defaults for them; set them in `grpo_overrides`.
ES_REDEFINED_FIELDS = tuple(
    name for name in GRPO_FIELDS if field_default(ESConfig, name) != field_default(GRPOConfig, name)
)

# Derived from the batch settings by each config's __post_init__: derived again for each stage, never copied.
DERIVED_FIELDS = ("generation_batch_size", "steps_per_generation")

# Fields of the whole run: SequentialTrainer gives each stage its own folder under `output_dir`, and pushes the final
# model once.
RUN_FIELDS = ("output_dir", "push_to_hub")

OVERRIDES_EXAMPLE = '{"learning_rate": 1e-6, "max_steps": 50}'


@dataclass
class SequenceArguments:
    """
    How a sequential run splits into an ES stage and a GRPO stage (for [`~trl.TrlParser`]).

    Args:
        order (`str`, *optional*, defaults to `"es-then-grpo"`):
            `"es-then-grpo"` or `"grpo-then-es"`.
        grpo_overrides (`dict` or `str`, *optional*):
            Fields of the GRPO stage's [`~trl.GRPOConfig`] that differ from the top-level flags: a dict in a YAML
            config, a JSON string on the command line (`--grpo_overrides '{"learning_rate": 1e-6, "max_steps": 50}'`).
        es_overrides (`dict` or `str`, *optional*):
            Fields of the ES stage's [`ESConfig`] that differ from the top-level flags, given the same way.
    """

    order: str = field(
        default="es-then-grpo",
        metadata={"help": "Which stage runs first.", "choices": list(ORDERS)},
    )
    grpo_overrides: dict | str | None = field(
        default=None,
        metadata={
            "help": "GRPOConfig fields for the GRPO stage only: a dict in YAML, or a JSON string such as "
            f"'{OVERRIDES_EXAMPLE}'. The GRPO stage otherwise copies the top-level flags, except the fields ES "
            f"redefines ({', '.join(ES_REDEFINED_FIELDS)}), which keep GRPOConfig's defaults."
        },
    )
    es_overrides: dict | str | None = field(
        default=None,
        metadata={"help": "ESConfig fields for the ES stage only: a dict in YAML, or a JSON string."},
    )

    def __post_init__(self):
        if self.order not in ORDERS:
            raise ValueError(f"Unknown order {self.order!r}: use one of {', '.join(ORDERS)}.")
        self.grpo_overrides = checked_overrides(self.grpo_overrides, GRPOConfig, "grpo_overrides")
        self.es_overrides = checked_overrides(self.es_overrides, ESConfig, "es_overrides")

    def stages(self, args: ESConfig) -> list[ESConfig | GRPOConfig]:
        """The two stage configs, in this order and with these overrides, built from the top-level `args`."""
        return stage_configs(args, self.order, es_overrides=self.es_overrides, grpo_overrides=self.grpo_overrides)


def stage_configs(
    args: ESConfig,
    order: str = "es-then-grpo",
    es_overrides: dict | str | None = None,
    grpo_overrides: dict | str | None = None,
) -> list[ESConfig | GRPOConfig]:
    """The stages of a sequential run, in `order`, from the top-level `args` (see the module docstring)."""
    if order not in ORDERS:
        raise ValueError(f"Unknown order {order!r}: use one of {', '.join(ORDERS)}.")
    es_stage, grpo_stage = stage_config(args, "es", es_overrides), stage_config(args, "grpo", grpo_overrides)
    return [es_stage, grpo_stage] if order == "es-then-grpo" else [grpo_stage, es_stage]


def stage_config(args: ESConfig, method: str, overrides: dict | str | None = None) -> ESConfig | GRPOConfig:
    """One stage's config (`method` `"es"` or `"grpo"`) from the top-level `args` and the stage's overrides."""
    chosen = {name: value for name, value in set_fields(args).items() if name not in RUN_FIELDS}
    if method == "es":
        # GRPO's loss settings are left out of the ES stage, which would ignore them with a second warning.
        es_fields = {name: value for name, value in chosen.items() if name not in GRPO_ONLY_FIELDS}
        overrides = checked_overrides(overrides, ESConfig, "es_overrides")
        return _build(ESConfig, "es_overrides", {"output_dir": args.output_dir, **es_fields, **overrides})
    overrides = checked_overrides(overrides, GRPOConfig, "grpo_overrides")
    _warn_about_es_only_values(chosen, overrides)
    grpo_fields = {
        name: value for name, value in chosen.items() if name in GRPO_FIELDS and name not in ES_REDEFINED_FIELDS
    }
    return _build(GRPOConfig, "grpo_overrides", {"output_dir": args.output_dir, **grpo_fields, **overrides})


def set_fields(args: ESConfig) -> dict[str, Any]:
    """The fields of `args` that were set: those that differ from an `ESConfig` built with no flags.

    Comparing with a built config rather than with the dataclass defaults ignores what `__post_init__` fills in
    (`report_to="none"` becomes `[]`, for one).
    """
    reference = ESConfig(output_dir=args.output_dir)
    return {
        name: getattr(args, name)
        for name in ES_FIELDS
        if name not in DERIVED_FIELDS and getattr(args, name) != getattr(reference, name)
    }


def checked_overrides(overrides: dict | str | None, config_class: type, name: str) -> dict[str, Any]:
    """`overrides` as a dict of `config_class` fields; a JSON string is parsed, and YAML's `1e-6` (a string) becomes
    a number. Raises a ValueError that names an unknown key and the field it probably meant."""
    if overrides is None or overrides == "":
        return {}
    if isinstance(overrides, str):
        try:
            overrides = json.loads(overrides)
        except json.JSONDecodeError as error:
            raise ValueError(
                f"{name} is not valid JSON ({error}): {overrides!r}. Write it as --{name} '{OVERRIDES_EXAMPLE}'."
            ) from None
    if not isinstance(overrides, dict):
        raise ValueError(
            f"{name} must be a mapping of {config_class.__name__} fields to values, got {overrides!r}. Write it as "
            f"--{name} '{OVERRIDES_EXAMPLE}', or as a mapping under `{name}:` in a YAML config."
        )
    fields = _init_fields(config_class)
    for key in overrides:
        if key not in fields:
            raise ValueError(
                f"{name} has the key {key!r}, which is not a field of {config_class.__name__}. "
                + _hint(key, name, fields)
            )
    return {key: _coerced(config_class, key, value) for key, value in overrides.items()}


def _hint(key: str, name: str, fields: tuple[str, ...]) -> str:
    if name == "grpo_overrides" and key in ES_ONLY_FIELDS:
        return f"{key} is an ES field: set it as a top-level flag (it configures the ES stage) or in es_overrides."
    close = difflib.get_close_matches(key, fields, n=1)
    suggestion = f"Did you mean {close[0]!r}? " if close else ""
    return f"{suggestion}Use the field names of the stage's config, e.g. --{name} '{OVERRIDES_EXAMPLE}'."


@functools.cache
def _field_types(config_class: type) -> dict[str, Any]:
    return typing.get_type_hints(config_class)


def _coerced(config_class: type, name: str, value: Any) -> Any:
    """A string given for a number or a boolean field, converted as the command-line parser would."""
    if not isinstance(value, str):
        return value
    hint = _field_types(config_class)[name]
    kinds = set(typing.get_args(hint)) or {hint}
    if str in kinds:
        return value
    for kind, convert in ((bool, string_to_bool), (int, int), (float, float)):
        if kind in kinds:
            try:
                return convert(value)
            except (TypeError, ValueError):
                continue
    return value


def _build(config_class: type, overrides_name: str, values: dict[str, Any]) -> ESConfig | GRPOConfig:
    try:
        return config_class(**values)
    except (TypeError, ValueError) as error:
        stage = "ES" if config_class is ESConfig else "GRPO"
        raise ValueError(
            f"The {stage} stage's {config_class.__name__} is invalid: {error}\nSet fields of the {stage} stage alone "
            f"with --{overrides_name} '{OVERRIDES_EXAMPLE}' (or `{overrides_name}:` in a YAML config)."
        ) from error


def _warn_about_es_only_values(chosen: dict[str, Any], grpo_overrides: dict[str, Any]) -> None:
    """Say which top-level values reach the ES stage only, because GRPO keeps its own defaults for them."""
    kept = [
        f"{name}={chosen[name]!r} (GRPO keeps {field_default(GRPOConfig, name)!r})"
        for name in ES_REDEFINED_FIELDS
        if name in chosen and name not in grpo_overrides and chosen[name] != field_default(GRPOConfig, name)
    ]
    if kept:
        warnings.warn(
            f"These flags configure the ES stage only: {', '.join(kept)}. ES redefines their meaning or default; "
            "set them for the GRPO stage in grpo_overrides.",
            UserWarning,
            stacklevel=3,
        )


@dataclass(repr=False)
class GRPOStageConfig(SettingsWithoutSecrets, GRPOConfig):
    """The [`~trl.GRPOConfig`] a GRPO stage trains with: the same settings, and what leaves the process holds no
    secret, as with an [`ESConfig`] (its `training_args.bin`, what its loggers record, its printed form)."""


def training_config(args: ESConfig | GRPOConfig) -> ESConfig | GRPOConfig:
    """A copy of a stage's config to train with (not `dataclasses.replace`, which would re-run `__post_init__`): a
    plain `GRPOConfig` becomes a [`GRPOStageConfig`] with the same values (issue 27: a GRPO stage's
    `training_args.bin` held its `hub_token` and any token in `model_init_kwargs`)."""
    if type(args) is not GRPOConfig:
        return copy.copy(args)
    stage_args = object.__new__(GRPOStageConfig)
    stage_args.__dict__.update(args.__dict__)
    return stage_args
