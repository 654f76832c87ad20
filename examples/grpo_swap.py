"""A plain TRL GRPO script, with two names swapped: ESConfig for GRPOConfig and ESTrainer for GRPOTrainer.

The script is the quick start of TRL's GRPOTrainer documentation, which on the Hugging Face Hub reads:

    from datasets import load_dataset
    from trl import GRPOConfig, GRPOTrainer

    dataset = load_dataset("trl-lib/tldr", split="train")

    # Define the reward function, which rewards completions that are close to 20 characters
    def reward_len(completions, **kwargs):
        return [-abs(20 - len(completion)) for completion in completions]

    training_args = GRPOConfig(output_dir="Qwen2-0.5B-GRPO")
    trainer = GRPOTrainer(
        model="Qwen/Qwen2-0.5B-Instruct",
        reward_funcs=reward_len,
        args=training_args,
        train_dataset=dataset,
    )
    trainer.train()

Run it with ES on the Hub model and dataset:

    python examples/grpo_swap.py --model Qwen/Qwen2-0.5B-Instruct --dataset trl-lib/tldr \\
        --output_dir Qwen2-0.5B-ES --max_steps 100

Without arguments it runs offline in well under a minute of training: a tiny Qwen2 built on the spot, four local
prompts, two small ES steps (`OFFLINE_SETTINGS`).
"""

import argparse
import tempfile

from datasets import Dataset, load_dataset

# from trl import GRPOConfig, GRPOTrainer
from trl_es import ESConfig, ESTrainer

OFFLINE_PROMPTS = [
    "SUBREDDIT: r/cooking TITLE: My bread never rises POST: I follow the recipe, but the dough stays flat. TL;DR:",
    "SUBREDDIT: r/running TITLE: Knee pain after 5k POST: Every run past 3 miles ends with a sore knee. TL;DR:",
    "SUBREDDIT: r/learnpython TITLE: Loops or list comprehensions? POST: Which one should a beginner use? TL;DR:",
    "SUBREDDIT: r/gardening TITLE: Yellow tomato leaves POST: The lower leaves turned yellow this week. TL;DR:",
]
# The tiny offline model with ES's defaults (30 members, 256 new tokens) would take minutes a step on a CPU.
OFFLINE_SETTINGS = dict(max_steps=2, population_size=4, per_device_train_batch_size=4, max_completion_length=16)


# Define the reward function, which rewards completions that are close to 20 characters
def reward_len(completions, **kwargs):
    return [-abs(20 - len(completion)) for completion in completions]


def main(model: str, dataset, output_dir: str, **settings):
    # training_args = GRPOConfig(output_dir="Qwen2-0.5B-GRPO")
    training_args = ESConfig(output_dir=output_dir, **settings)
    # trainer = GRPOTrainer(
    trainer = ESTrainer(
        model=model,
        reward_funcs=reward_len,
        args=training_args,
        train_dataset=dataset,
    )
    trainer.train()
    trainer.save_model(output_dir)
    print(f"Model saved to {output_dir}.")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="Hub id or local path (default: a tiny Qwen2 built offline).")
    parser.add_argument("--dataset", default=None, help="Hub dataset with a `prompt` column (default: local prompts).")
    parser.add_argument("--output_dir", default=None, help="Where to save the model (default: a temporary folder).")
    parser.add_argument("--max_steps", type=int, default=None, help="ES steps (default: one epoch; offline: 2).")
    cli = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="grpo-swap-")
    settings = {} if cli.max_steps is None else {"max_steps": cli.max_steps}
    if cli.model is None:
        from trl_es.testing import save_tiny_model

        cli.model = str(save_tiny_model(f"{workdir}/tiny-qwen2"))
        settings = {**OFFLINE_SETTINGS, **settings}
    dataset = (
        load_dataset(cli.dataset, split="train") if cli.dataset else Dataset.from_dict({"prompt": OFFLINE_PROMPTS})
    )
    main(cli.model, dataset, cli.output_dir or f"{workdir}/es", **settings)
