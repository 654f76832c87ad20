"""An offline toy task with a dense verifiable reward, for tests, benchmarks and examples: write digits.

A randomly initialised model decoded greedily repeats one token, so a sparse reward gives every member the same
fitness. This task samples (temperature 1) and rewards the fraction of digit characters in a completion, which every
member moves a little; with common random numbers, ES climbs it within tens of steps on two CPU cores.
"""

from __future__ import annotations

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
