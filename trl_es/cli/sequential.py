"""ES then GRPO, or GRPO then ES, with SequentialTrainer: `trl-es es-then-grpo` and `trl-es grpo-then-es`.

    trl-es es-then-grpo --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --dataset_name openai/gsm8k \\
        --reward_funcs accuracy_reward --output_dir Qwen2.5-0.5B-ES-GRPO --max_steps 200 \\
        --grpo_overrides '{"learning_rate": 1e-6, "max_steps": 50}'
    trl-es grpo-then-es --config sequence.yaml --accelerate_config multi_gpu --num_processes 8

How the two stages are configured, from one set of flags (see `trl_es/sequential/stage_configs.py`):

- the top-level flags (or YAML keys) are parsed as one ESConfig, with the script arguments of `trl-es es` and
  `trl.ModelConfig`. The ES stage uses that config as is.
- The GRPO stage gets a GRPOConfig with every top-level field that was set copied over, except the fields whose
  default or meaning ES redefines: `learning_rate` (the ES step size is no AdamW learning rate), `lr_scheduler_type`,
  `num_generations`, `temperature`, `bf16`, `disable_dropout` and `gradient_checkpointing` keep GRPOConfig's defaults
  (a warning names the ones you set).
- `grpo_overrides` then sets fields of the GRPO stage only, and `es_overrides` fields of the ES stage only: a mapping
  in YAML, a JSON string on the command line. An unknown key is an error that names the field it probably meant.

Each stage trains in `output_dir/stage-<i>-<es|grpo>`; the final model is `final/` of the last stage's folder, with a
model card listing both stages. Run the same command again after an interruption: finished stages are skipped and the
running one resumes. `order` is set by the command (`--order` when the script runs on its own:
`accelerate launch trl_es/cli/sequential.py --order grpo-then-es ...`).
"""

import argparse
from pathlib import Path

from trl_es.cli.es import check_model, load_datasets, load_reward_funcs, model_init_kwargs


def main(script_args, sequence_args, training_args, model_args, dataset_args):
    from trl_es.sequential.trainer import SequentialTrainer

    check_model(model_args)
    if model_args.use_peft or model_args.load_in_4bit or model_args.load_in_8bit:
        raise ValueError(
            "SequentialTrainer hands full checkpoints between stages and takes no PEFT or quantization config yet: "
            "drop --use_peft/--load_in_4bit/--load_in_8bit, or train a single stage with `trl-es es`."
        )
    reward_funcs = load_reward_funcs(script_args)
    training_args.model_init_kwargs = model_init_kwargs(model_args, training_args)
    train_dataset, eval_dataset = load_datasets(
        script_args, dataset_args, seed=training_args.seed, with_eval=training_args.eval_strategy != "no"
    )

    sequence = SequentialTrainer(
        model=model_args.model_name_or_path,
        stages=sequence_args.stages(training_args),
        output_dir=training_args.output_dir,
        reward_funcs=reward_funcs,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
    )
    train_and_push(sequence, training_args, dataset_name=script_args.dataset_name)


def train_and_push(sequence, training_args, dataset_name: str | None = None) -> None:
    """Train a `SequentialTrainer` (or an `EvolmTrainer`), push its final model when asked (to `hub_model_id`, branch
    `hub_revision`, with a card naming `dataset_name`), and leave together."""
    from accelerate import PartialState

    final_model = sequence.train()
    state = PartialState()
    if state.is_main_process:
        print(f"Training completed. Final model saved to {final_model}.")
        if training_args.push_to_hub:
            repo_id = training_args.hub_model_id or Path(training_args.output_dir).name
            sequence.push_to_hub(
                repo_id,
                private=training_args.hub_private_repo,
                revision=training_args.hub_revision,
                dataset_name=dataset_name,
            )
            print(f"Model pushed to the Hub in https://huggingface.co/{repo_id}.")

    # Leave together and tear the process group down: a rank that exits while gloo threads still run aborts.
    state.wait_for_everyone()
    state.destroy_process_group()


def make_parser(prog: str | None = None) -> argparse.ArgumentParser:
    from trl import DatasetMixtureConfig, ModelConfig, TrlParser

    from trl_es.cli.es import ESScriptArguments
    from trl_es.sequential.stage_configs import SequenceArguments
    from trl_es.trainer.es_config import ESConfig

    dataclass_types = (ESScriptArguments, SequenceArguments, ESConfig, ModelConfig, DatasetMixtureConfig)
    return TrlParser(dataclass_types, prog=prog)


if __name__ == "__main__":
    parser = make_parser()
    main(*parser.parse_args_and_config(fail_with_unknown_args=False))
