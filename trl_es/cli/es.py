"""Train with Evolution Strategies: TRL's `trl grpo` script, with ESTrainer.

    trl-es es --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --dataset_name openai/gsm8k \\
        --reward_funcs accuracy_reward --output_dir Qwen2.5-0.5B-ES
    trl-es es --config es.yaml --accelerate_config multi_gpu --num_processes 8

The flags are the fields of ESConfig (every GRPOConfig field, plus `population_size`, `sigma`, ...), of
`trl.ModelConfig`, of `trl.DatasetMixtureConfig` and of `ESScriptArguments` below; `--config` reads them from a YAML
file. Flags that none of them takes (`--num_processes`, `--accelerate_config single_gpu|multi_gpu|...`) go to
`accelerate launch`. The script also runs on its own: `accelerate launch trl_es/cli/es.py --help`.
`--resume_from_checkpoint` takes a checkpoint folder, or `true` for the last complete checkpoint in `--output_dir`.
"""

import argparse
import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from trl import ScriptArguments

REWARD_FUNCS_HELP = (
    "Reward functions: `accuracy_reward`, `reasoning_accuracy_reward`, `think_format_reward`, "
    "`get_soft_overlong_punishment` (with `max_completion_len=1280`, `soft_punish_cache=256`, as in `trl grpo`), "
    "`arithmetic_reward` (for `--dataset_name arithmetic`), or any dotted import path (e.g. "
    "`my_lib.rewards.custom_reward`)."
)

# TrainingArguments' own help names only a path.
RESUME_HELP = (
    "A checkpoint folder to resume from, or `true` (`True`): the last complete checkpoint in `output_dir`, skipping "
    "any that a crash left half-written, as `resume_from_checkpoint=True` (an error when there is none). `false` "
    "starts a fresh run."
)


@dataclass
class ESScriptArguments(ScriptArguments):
    """
    Script arguments of the `trl-es` training scripts.

    Args:
        dataset_name (`str`, *optional*):
            A dataset that [`~datasets.load_dataset`] reads (a Hub id or a local folder) with a `prompt` column, or a
            built-in task: `"openai/gsm8k"` (GSM8K as conversational prompts with a `solution` column),
            `"reasoning-gym/gsm_symbolic"` (GSM8K-style problems generated offline) or `"arithmetic"` (offline word
            problems with an `answer` column).
        reward_model_name_or_path (`str`, *optional*):
            Reward model id of a pretrained model hosted inside a model repo on huggingface.co or local path to a
            directory containing model weights saved using [`~transformers.PreTrainedModel.save_pretrained`].
        reward_funcs (`list[str]`, *optional*):
            Reward functions to use. Supported values are:
                - `"accuracy_reward"`
                - `"reasoning_accuracy_reward"`
                - `"think_format_reward"`
                - `"get_soft_overlong_punishment"` (used values are `max_completion_len=1280`, `soft_punish_cache=256`)
                - `"arithmetic_reward"` (for `dataset_name="arithmetic"`)
                - any dotted import path (e.g., `'my_lib.rewards.custom_reward'`).
        num_offline_problems (`int`, *optional*, defaults to `1024`):
            Problems generated for an offline built-in task (`reasoning-gym/gsm_symbolic`, `arithmetic`).
    """

    dataset_name: str | None = field(
        default=None,
        metadata={
            "help": "Hub id or local folder of a dataset with a `prompt` column, or a built-in task: openai/gsm8k, "
            "reasoning-gym/gsm_symbolic (offline), arithmetic (offline). If `datasets` is provided, this is ignored."
        },
    )
    reward_model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "Reward model id of a pretrained model hosted inside a model repo on huggingface.co or "
            "local path to a directory containing model weights saved using `PreTrainedModel.save_pretrained`."
        },
    )
    reward_funcs: list[str] | None = field(default=None, metadata={"help": REWARD_FUNCS_HELP})
    num_offline_problems: int = field(
        default=1024,
        metadata={"help": "Problems generated for an offline built-in task (reasoning-gym/gsm_symbolic, arithmetic)."},
    )


def reward_funcs_registry() -> dict[str, Callable]:
    """The reward functions that `--reward_funcs` takes by name."""
    from trl.rewards import (
        accuracy_reward,
        get_soft_overlong_punishment,
        reasoning_accuracy_reward,
        think_format_reward,
    )

    registry = {
        "accuracy_reward": accuracy_reward,
        "reasoning_accuracy_reward": reasoning_accuracy_reward,
        "think_format_reward": think_format_reward,
        "get_soft_overlong_punishment": get_soft_overlong_punishment(max_completion_len=1280, soft_punish_cache=256),
    }
    try:
        from trl_es.tasks.arithmetic import arithmetic_reward
    except ImportError:
        pass
    else:
        registry["arithmetic_reward"] = arithmetic_reward
    return registry


def load_reward_funcs(script_args: ESScriptArguments) -> list:
    """The reward model and functions named by the script arguments, in the order `trl grpo` puts them."""
    registry = reward_funcs_registry()
    reward_funcs = [script_args.reward_model_name_or_path] if script_args.reward_model_name_or_path else []
    for name in script_args.reward_funcs or []:
        if name in registry:
            reward_funcs.append(registry[name])
        elif "." in name:
            module_path, func_name = name.rsplit(".", 1)
            sys.path.insert(0, os.getcwd())  # as in `trl grpo`: a module next to where the command runs
            reward_funcs.append(getattr(importlib.import_module(module_path), func_name))
        else:
            raise ValueError(
                f"Could not load reward function {name!r}. Expected one of {list(registry)} or a dotted import path "
                "such as my_lib.rewards.custom_reward."
            )
    if not reward_funcs:
        raise ValueError(
            "No reward: pass --reward_funcs (e.g. accuracy_reward, or my_lib.rewards.custom_reward) or "
            "--reward_model_name_or_path."
        )
    return reward_funcs


def built_in_datasets() -> dict[str, Callable]:
    """Datasets that the scripts build rather than load as they are: name -> `load(script_args, split, seed)`."""
    from trl_es.tasks.gsm8k import HUB_DATASET, OFFLINE_DATASET, gsm8k_dataset

    def hub_gsm8k(script_args, split, seed):
        return gsm8k_dataset(HUB_DATASET, script_args.dataset_config or "main", split=split)

    def offline_gsm8k(script_args, split, seed):
        seed = seed if split == script_args.dataset_train_split else seed + 1  # another seed draws other problems
        return gsm8k_dataset(OFFLINE_DATASET, num_offline_problems=script_args.num_offline_problems, seed=seed)

    datasets = {HUB_DATASET: hub_gsm8k, OFFLINE_DATASET: offline_gsm8k}
    try:
        from trl_es.tasks.arithmetic import arithmetic_dataset
    except ImportError:
        pass
    else:
        datasets["arithmetic"] = lambda script_args, split, seed: arithmetic_dataset(
            split=split, size=script_args.num_offline_problems
        )
    return datasets


def load_datasets(script_args: ESScriptArguments, dataset_args, seed: int, with_eval: bool) -> tuple:
    """(train dataset, eval dataset or None), from `datasets` (a mixture), a built-in task or `load_dataset`."""
    from datasets import load_dataset
    from trl import get_dataset

    built_in = built_in_datasets()
    name = script_args.dataset_name
    train_split, test_split = script_args.dataset_train_split, script_args.dataset_test_split
    if dataset_args.datasets:
        if name:
            print(f"Both `datasets` and `dataset_name` are given: training on `datasets`, ignoring {name!r}.")
        dataset = get_dataset(dataset_args)
    elif name in built_in:
        load = built_in[name]
        return load(script_args, train_split, seed), load(script_args, test_split, seed) if with_eval else None
    elif name:
        try:
            dataset = load_dataset(name, name=script_args.dataset_config, streaming=script_args.dataset_streaming)
        except Exception as error:  # a missing folder, no network and an unknown Hub id all surface differently
            raise RuntimeError(
                f"Could not load the dataset {name!r} ({type(error).__name__}: {error}). Pass a Hub dataset id, a "
                "local folder or data file that `datasets.load_dataset` reads, or a built-in task: "
                f"{', '.join(built_in)}."
            ) from error
    else:
        raise ValueError(
            "No dataset: pass --dataset_name (a Hub id, a local folder, or a built-in task: "
            f"{', '.join(built_in)}), or `datasets:` in a YAML config."
        )
    return dataset[train_split], dataset[test_split] if with_eval else None


def resume_argument(value: str | bool | None) -> str | bool | None:
    """`--resume_from_checkpoint` as `ESTrainer.train` takes it: `true` in any case (a YAML config's `true` arrives
    as the bool) is True, the last complete checkpoint; `false` is None, a fresh run; any other value is a path."""
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true" or None
    return value or None


def model_init_kwargs(model_args, training_args) -> dict:
    """How the trainers load the model: `trl.ModelConfig`'s fields, then the config's own `model_init_kwargs`."""
    kwargs = dict(
        revision=model_args.model_revision,
        trust_remote_code=training_args.trust_remote_code,
        attn_implementation=model_args.attn_implementation,
        dtype=model_args.dtype,
    )
    return {**kwargs, **(training_args.model_init_kwargs or {})}


def check_model(model_args) -> None:
    if not model_args.model_name_or_path:
        raise ValueError("No model: pass --model_name_or_path (a Hub id or a local folder).")


def main(script_args, training_args, model_args, dataset_args):
    from trl import get_peft_config, get_quantization_config

    from trl_es.trainer.es_trainer import ESTrainer

    check_model(model_args)
    reward_funcs = load_reward_funcs(script_args)
    training_args.model_init_kwargs = model_init_kwargs(model_args, training_args)
    train_dataset, eval_dataset = load_datasets(
        script_args, dataset_args, seed=training_args.seed, with_eval=training_args.eval_strategy != "no"
    )

    trainer = ESTrainer(
        model=model_args.model_name_or_path,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        quantization_config=get_quantization_config(model_args),
        peft_config=get_peft_config(model_args),
    )
    trainer.train(resume_from_checkpoint=resume_argument(training_args.resume_from_checkpoint))
    trainer.accelerator.print("Training completed.")

    trainer.save_model(training_args.output_dir)
    trainer.accelerator.print(f"Model saved to {training_args.output_dir}.")
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name)
        trainer.accelerator.print(f"Model pushed to the Hub in https://huggingface.co/{trainer.hub_model_id}.")

    # Leave together and tear the process group down: a rank that exits while gloo threads still run aborts.
    trainer.accelerator.wait_for_everyone()
    trainer.accelerator.end_training()


def make_parser(prog: str | None = None) -> argparse.ArgumentParser:
    from trl import DatasetMixtureConfig, ModelConfig, TrlParser

    from trl_es.compat.transformers import set_flag_help
    from trl_es.trainer.es_config import ESConfig

    parser = TrlParser((ESScriptArguments, ESConfig, ModelConfig, DatasetMixtureConfig), prog=prog)
    set_flag_help(parser, "resume_from_checkpoint", RESUME_HELP)
    return parser


if __name__ == "__main__":
    parser = make_parser()
    main(*parser.parse_args_and_config(fail_with_unknown_args=False))
