"""ES on an offline toy task: a tiny locally built Qwen2 learns to write digits.

Runs anywhere, without the Hub (the model and tokenizer are built on the spot):

    accelerate launch examples/es_digits.py --output_dir es-digits --use_cpu
    accelerate launch --config_file examples/accelerate_configs/multi_gpu.yaml --num_processes 2 \
        examples/es_digits.py --output_dir es-digits --use_cpu    # two CPU processes, population split in two

Every `ESConfig` (and so `GRPOConfig`) field is a flag, e.g. `--population_size 16 --sigma 0.1 --learning_rate 0.05`.
"""

from dataclasses import dataclass, field

from trl import TrlParser

from trl_es import ESConfig, ESTrainer
from trl_es.testing import PEAKED_INITIALIZER_RANGE, digit_fraction, digit_prompts, save_tiny_model


@dataclass
class ScriptArguments:
    num_prompts: int = field(default=64, metadata={"help": "Number of training prompts."})


def main(script_args: ScriptArguments, training_args: ESConfig):
    with training_args.main_process_first(desc="building the tiny model"):  # one process writes it, the others read
        model_path = save_tiny_model(
            f"{training_args.output_dir}/base-model", initializer_range=PEAKED_INITIALIZER_RANGE
        )
    trainer = ESTrainer(
        model=str(model_path),
        reward_funcs=digit_fraction,
        args=training_args,
        train_dataset=digit_prompts(script_args.num_prompts),
    )
    trainer.train()
    trainer.save_model(training_args.output_dir)
    trainer.accelerator.wait_for_everyone()  # a rank that exits while another still runs a collective aborts
    trainer.accelerator.end_training()


if __name__ == "__main__":
    parser = TrlParser((ScriptArguments, ESConfig))
    # Settings that suit this toy task (see trl_es/demo/run.py); every one can be overridden by a flag.
    parser.set_defaults(
        population_size=16,
        sigma=0.1,
        learning_rate=0.05,
        temperature=1.0,
        per_device_train_batch_size=16,
        max_completion_length=16,
        max_steps=60,
        report_to="none",
    )
    script_args, training_args = parser.parse_args_and_config()
    main(script_args, training_args)
