"""ES on GSM8K with ESTrainer, in TRL's example style.

    accelerate launch examples/es_gsm8k.py --output_dir Qwen2.5-0.5B-ES-GSM8K
    accelerate launch --config_file examples/accelerate_configs/multi_gpu.yaml examples/es_gsm8k.py \\
        --output_dir Qwen2.5-0.5B-ES-GSM8K --use_vllm --vllm_mode colocate

Without the Hugging Face Hub, generate GSM8K-style problems locally and pass a local model:

    python examples/es_gsm8k.py --dataset_name reasoning-gym/gsm_symbolic --model_name_or_path ./my-model \\
        --output_dir es-gsm8k --use_cpu

Every `ESConfig` field is a flag (`--population_size 30 --sigma 1e-3 --learning_rate 5e-4` are the defaults).
"""

from trl import ModelConfig, TrlParser
from trl.rewards import accuracy_reward

from trl_es import ESConfig, ESTrainer
from trl_es.tasks.gsm8k import GSM8KScriptArguments


def main(script_args: GSM8KScriptArguments, training_args: ESConfig, model_args: ModelConfig):
    training_args.model_init_kwargs = {"dtype": model_args.dtype, "revision": model_args.model_revision}
    dataset = script_args.train_dataset(seed=training_args.seed)
    try:
        trainer = ESTrainer(
            model=model_args.model_name_or_path,
            reward_funcs=accuracy_reward,
            args=training_args,
            train_dataset=dataset,
        )
    except OSError as error:  # what transformers raises when the Hub cannot be reached for a model id
        raise SystemExit(
            f"Could not load the model {model_args.model_name_or_path!r} ({error}). Without the Hub, pass a local "
            "model with --model_name_or_path."
        ) from error
    trainer.train()
    trainer.save_model(training_args.output_dir)
    trainer.accelerator.wait_for_everyone()  # a rank that exits while another still runs a collective aborts
    trainer.accelerator.end_training()


if __name__ == "__main__":
    parser = TrlParser((GSM8KScriptArguments, ESConfig, ModelConfig))
    parser.set_defaults(model_name_or_path="Qwen/Qwen2.5-0.5B-Instruct", max_completion_length=512, report_to="none")
    main(*parser.parse_args_and_config())
