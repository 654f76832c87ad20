"""ES on GSM8K with a calculator tool: every population member solves each problem in as many turns as it needs,
calling the calculator with its own weights, and is scored on its final answer.

On a GPU (the model writes the tool calls; vLLM generates every member's turns):

    accelerate launch examples/es_gsm8k_tools.py --output_dir Qwen2.5-1.5B-ES-GSM8K-tools \\
        --model_name_or_path Qwen/Qwen2.5-1.5B-Instruct --use_vllm --vllm_mode colocate \\
        --population_size 30 --max_completion_length 768 --max_tool_calling_iterations 4

Offline on CPU, a tiny model built locally (it calls the tool only by chance; the run shows the mechanics, not
learning):

    python examples/es_gsm8k_tools.py --tiny --output_dir es-gsm8k-tools --use_cpu

Every `ESConfig` field is a flag; the dataset flags are those of examples/es_gsm8k.py.
"""

from dataclasses import dataclass, field
from pathlib import Path

from trl import ModelConfig, TrlParser
from trl.rewards import accuracy_reward

from trl_es import ESConfig, ESTrainer
from trl_es.tasks.gsm8k import OFFLINE_DATASET, TOOL_INSTRUCTION, GSM8KScriptArguments, calculator
from trl_es.testing import build_tiny_qwen2, build_tool_tokenizer


@dataclass
class ToolScriptArguments(GSM8KScriptArguments):
    tiny: bool = field(
        default=False,
        metadata={"help": "Build a tiny tool-calling model locally and train a few steps offline (a smoke run)."},
    )


def tiny_model(output_dir: str) -> str:
    """A tiny Qwen2 with a compact tool-calling chat template, saved under `output_dir` (no download)."""
    path = Path(output_dir) / "tiny-model"
    tokenizer = build_tool_tokenizer()
    model = build_tiny_qwen2(tokenizer, initializer_range=0.3)
    model.config.max_position_embeddings = 2048  # GSM8K questions are long in a 320-token vocabulary
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def main(script_args: ToolScriptArguments, training_args: ESConfig, model_args: ModelConfig):
    model = model_args.model_name_or_path
    if script_args.tiny:
        script_args.dataset_name, script_args.num_offline_problems = OFFLINE_DATASET, 8
        model = tiny_model(training_args.output_dir)
    training_args.model_init_kwargs = {"dtype": model_args.dtype, "revision": model_args.model_revision}
    dataset = script_args.train_dataset(seed=training_args.seed, instruction=TOOL_INSTRUCTION)
    trainer = ESTrainer(
        model=model, reward_funcs=accuracy_reward, args=training_args, train_dataset=dataset, tools=[calculator]
    )
    trainer.train()
    trainer.save_model(training_args.output_dir)
    trainer.accelerator.wait_for_everyone()
    trainer.accelerator.end_training()


if __name__ == "__main__":
    parser = TrlParser((ToolScriptArguments, ESConfig, ModelConfig))
    parser.set_defaults(model_name_or_path="Qwen/Qwen2.5-1.5B-Instruct", max_completion_length=512, report_to="none")
    script_args, training_args, model_args = parser.parse_args_and_config()
    if script_args.tiny:  # a smoke run: a few short steps
        training_args.population_size, training_args.per_device_train_batch_size = 2, 2
        training_args.max_steps, training_args.max_completion_length = 2, 24
    main(script_args, training_args, model_args)
