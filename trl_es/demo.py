"""The offline demo: ES on a tiny locally built model, printing the held-out reward before and after.

`trl-es demo` (or `make demo`) runs it on CPU in about a minute. Everything is built on the spot: a byte-level BPE
tokenizer, a randomly initialised 2-layer Qwen2 and the digit-writing toy task (`trl_es.toy_task`).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer

from .es_config import ESConfig
from .es_trainer import ESTrainer
from .tiny_model import save_tiny_model
from .toy_task import digit_fraction, digit_prompts, mean_sampled_reward

# A larger initialisation than the usual 0.02 gives the random model peaked output distributions, so a perturbation
# changes what members write; with 0.02 every member samples near-uniform noise.
DEMO_INITIALIZER_RANGE = 0.3


@dataclass
class DemoResult:
    reward_before: float
    reward_after: float
    steps: int
    output_dir: str


def run_demo(
    output_dir: str | None = None,
    max_steps: int = 60,
    population_size: int = 16,
    sigma: float = 0.1,
    learning_rate: float = 0.05,
    seed: int = 0,
    log=print,
) -> DemoResult:
    """Train the tiny model with ES on the digit task and measure the held-out reward before and after."""
    output_dir = output_dir or tempfile.mkdtemp(prefix="trl-es-demo-")
    model_path = save_tiny_model(Path(output_dir) / "base-model", initializer_range=DEMO_INITIALIZER_RANGE)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    held_out = list(digit_prompts(32, offset=1000)["prompt"])

    def held_out_reward(model):
        return mean_sampled_reward(model, tokenizer, held_out, max_new_tokens=16, samples_per_prompt=4)

    reward_before = held_out_reward(AutoModelForCausalLM.from_pretrained(model_path))
    log(f"held-out reward before ES: {reward_before:.3f}  (fraction of digit characters, sampled at temperature 1)")

    args = ESConfig(
        output_dir=str(Path(output_dir) / "es"),
        population_size=population_size,
        sigma=sigma,
        learning_rate=learning_rate,
        temperature=1.0,  # members sample with shared seeds (common random numbers)
        per_device_train_batch_size=16,
        max_completion_length=16,
        max_steps=max_steps,
        logging_steps=10,
        save_strategy="no",
        report_to=[],
        seed=seed,
        use_cpu=True,
    )
    trainer = ESTrainer(model=str(model_path), reward_funcs=digit_fraction, args=args, train_dataset=digit_prompts(64))
    trainer.train()
    trainer.save_model()

    reward_after = held_out_reward(trainer.model)
    log(f"held-out reward after {max_steps} ES steps: {reward_after:.3f}  (model saved to {args.output_dir})")
    return DemoResult(reward_before, reward_after, max_steps, args.output_dir)
