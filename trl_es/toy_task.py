"""An offline toy task with a dense verifiable reward, for tests and the demo: write digits.

A randomly initialised model decoded greedily repeats one token, so a sparse reward gives every member the same
fitness. This task samples (temperature 1) and rewards the fraction of digit characters in a completion, which every
member moves a little; with common random numbers, ES climbs it within tens of steps on two CPU cores.
"""

from __future__ import annotations

import torch
from datasets import Dataset

# A larger initialisation than the usual 0.02 gives a random model peaked output distributions, so a perturbation
# changes what members write; with 0.02 every member samples near-uniform noise.
PEAKED_INITIALIZER_RANGE = 0.3


def digit_prompts(num_prompts: int, offset: int = 0) -> Dataset:
    """Plain-text prompts `"Item <k>:"`; use a different `offset` for a held-out set."""
    return Dataset.from_dict({"prompt": [f"Item {k}:" for k in range(offset, offset + num_prompts)]})


def digit_fraction(completions: list, **kwargs) -> list[float]:
    """Reward: the fraction of characters of each completion that are digits (0 for an empty completion)."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [sum(ch.isdigit() for ch in text) / len(text) if text else 0.0 for text in texts]


@torch.no_grad()
def mean_sampled_reward(
    model,
    tokenizer,
    prompts: list[str],
    reward_func=digit_fraction,
    max_new_tokens: int = 16,
    samples_per_prompt: int = 4,
    seed: int = 1234,
) -> float:
    """Mean reward of sampled (temperature 1) completions of `model` on `prompts`, with a fixed sampling seed."""
    was_training = model.training
    model.eval()
    inputs = tokenizer(prompts * samples_per_prompt, return_tensors="pt", padding=True).to(model.device)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        output = model.generate(
            **inputs,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_new_tokens,
            pad_token_id=tokenizer.pad_token_id,
        )
    model.train(was_training)
    completions = tokenizer.batch_decode(output[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    rewards = reward_func(completions)
    return sum(rewards) / len(rewards)
