"""What `ESTrainer` is given, checked (and a `GRPOConfig` converted) before anything is built: the config, the model
for the chosen backend, and the datasets. The config checks itself (`config_checks.py`); these are the checks that
need the other arguments."""

from __future__ import annotations

import warnings
from pathlib import Path

from accelerate.utils import is_peft_model
from datasets import IterableDataset
from trl import GRPOConfig

from .es_config import ESConfig
from .grpo_conversion import conversion_notes


def as_es_config(args: ESConfig | GRPOConfig | None, model) -> ESConfig:
    """`args` as an `ESConfig`: a `GRPOConfig` is converted (with a warning saying what changed), None gives the
    defaults with `output_dir="<model name>-ES"`."""
    if isinstance(args, ESConfig):
        return args
    if args is None:
        model_name = model if isinstance(model, str) else model.config.name_or_path
        return ESConfig(f"{Path(str(model_name)).name}-ES")
    if isinstance(args, GRPOConfig):
        es_args = ESConfig.from_grpo_config(args)
        warnings.warn(conversion_notes(args, es_args), UserWarning, stacklevel=3)
        return es_args
    raise TypeError(f"args must be an ESConfig or a GRPOConfig, got {type(args).__name__}.")


def check_model_fits_backend(args: ESConfig, model, peft_config) -> None:
    if args.use_vllm and (peft_config is not None or (not isinstance(model, str) and is_peft_model(model))):
        raise NotImplementedError(
            "ESTrainer with vLLM evolves full weights only; with a PEFT adapter, generate with `use_vllm=False`."
        )


def check_datasets(train_dataset, eval_dataset, args: ESConfig, environments: bool = False) -> None:
    """Refuse datasets ES cannot train or evaluate on, before anything is built. With `environments`, a row may have
    no `prompt` (its environment's `reset` writes it, as in GRPO)."""
    if train_dataset is not None and hasattr(train_dataset, "__len__") and len(train_dataset) == 0:
        raise ValueError("train_dataset is empty: ES needs at least one prompt per step. Check the dataset split.")
    if not environments:
        check_prompt_column(train_dataset, "train_dataset")
        check_prompt_column(eval_dataset, "eval_dataset")
    _check_prompts_fill_a_step(train_dataset, args)


def check_prompt_column(dataset, name: str) -> None:
    """Refuse a dataset (or dict of datasets) without a `prompt` column, which every ES step reads."""
    if isinstance(dataset, dict):
        for key, split in dataset.items():
            check_prompt_column(split, f"{name}[{key!r}]")
        return
    columns = getattr(dataset, "column_names", None)
    if columns is None and isinstance(dataset, IterableDataset):
        # An iterable dataset whose features are unknown: its first example says (issue 27: a KeyError at step 1)
        first = next(iter(dataset), None)
        columns = list(first) if isinstance(first, dict) else None
    if columns is not None and "prompt" not in columns:
        raise ValueError(
            f"{name} has no 'prompt' column (its columns: {columns}). ESTrainer, like GRPOTrainer, reads each "
            "example's prompt from it: rename the column holding the prompts, e.g. "
            "`dataset = dataset.rename_column('question', 'prompt')`."
        )


def _check_prompts_fill_a_step(dataset, args: ESConfig) -> None:
    """GRPO's sampler drops an incomplete batch, so a train set smaller than one step would end training at step 0
    without a single update."""
    prompts_per_step = args.prompts_per_step
    if dataset is not None and hasattr(dataset, "__len__") and 0 < len(dataset) < prompts_per_step:
        raise ValueError(
            f"train_dataset has {len(dataset)} prompts, fewer than the {prompts_per_step} prompts of one ES step "
            f"(per_device_train_batch_size={args.per_device_train_batch_size} x gradient_accumulation_steps="
            f"{args.gradient_accumulation_steps} x processes={args.world_size} / num_generations="
            f"{args.num_generations}), so training would stop at step 0 without an update. Lower "
            "per_device_train_batch_size to at most the number of prompts, or add prompts."
        )
