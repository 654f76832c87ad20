"""ES then GRPO (or GRPO then ES) on GSM8K with SequentialTrainer, in TRL's example style.

    accelerate launch examples/sequential_gsm8k.py --output_dir Qwen2.5-0.5B-ES-GRPO-GSM8K \\
        --max_steps 200 --grpo_overrides '{"max_steps": 200}'
    accelerate launch examples/sequential_gsm8k.py --order grpo-then-es --output_dir Qwen2.5-0.5B-GRPO-ES-GSM8K \\
        --max_steps 200 --grpo_overrides '{"max_steps": 200}'
    accelerate launch --config_file examples/accelerate_configs/multi_gpu.yaml examples/sequential_gsm8k.py \\
        --output_dir Qwen2.5-0.5B-ES-GRPO-GSM8K --population_size 32

Without the Hugging Face Hub, generate GSM8K-style problems locally and pass a local model:

    python examples/sequential_gsm8k.py --dataset_name reasoning-gym/gsm_symbolic --model_name_or_path ./my-model \\
        --output_dir es-grpo-gsm8k --use_cpu --grpo_overrides '{"bf16": false}'

The flags are ESConfig's and configure the ES stage. The GRPO stage copies them, except the fields whose meaning or
default ES redefines (`learning_rate`, `lr_scheduler_type`, `num_generations`, `temperature`, `bf16`, ...), which keep
GRPOConfig's defaults; `--grpo_overrides` (JSON) sets fields of the GRPO stage only and `--es_overrides` fields of the
ES stage only (`trl_es/sequential/stage_configs.py`). `trl-es es-then-grpo` runs the same with any dataset and reward.
"""

from accelerate import PartialState
from trl import ModelConfig, TrlParser
from trl.rewards import accuracy_reward

from trl_es import ESConfig
from trl_es.sequential.stage_configs import SequenceArguments
from trl_es.sequential.trainer import SequentialTrainer
from trl_es.tasks.gsm8k import GSM8KScriptArguments


def main(script_args: GSM8KScriptArguments, sequence_args: SequenceArguments, training_args: ESConfig, model_args):
    training_args.model_init_kwargs = {"dtype": model_args.dtype, "revision": model_args.model_revision}
    dataset = script_args.train_dataset(seed=training_args.seed)
    sequence = SequentialTrainer(
        model=model_args.model_name_or_path,
        stages=sequence_args.stages(training_args),
        output_dir=training_args.output_dir,
        reward_funcs=accuracy_reward,
        train_dataset=dataset,
    )
    final_model = sequence.train()
    state = PartialState()
    if state.is_main_process:
        print(f"Final model (with a model card listing both stages): {final_model}")
    state.wait_for_everyone()
    state.destroy_process_group()  # shut the process group down cleanly under multi-process launches


if __name__ == "__main__":
    parser = TrlParser((GSM8KScriptArguments, SequenceArguments, ESConfig, ModelConfig))
    parser.set_defaults(model_name_or_path="Qwen/Qwen2.5-0.5B-Instruct", max_completion_length=512, report_to="none")
    main(*parser.parse_args_and_config())
