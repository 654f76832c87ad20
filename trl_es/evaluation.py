"""Held-out evaluation of a model with a verifier: greedy accuracy, and Pass@k / Maj@k from sampled completions."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from .metrics import maj_at_k, pass_at_k


@dataclass
class CoverageReport:
    """Mean over prompts of each measurement; `pass_at_k[k]` and `maj_at_k[k]` for every k asked for."""

    greedy_accuracy: float
    pass_at_k: dict[int, float] = field(default_factory=dict)
    maj_at_k: dict[int, float] = field(default_factory=dict)
    num_prompts: int = 0
    samples_per_prompt: int = 0

    def as_dict(self) -> dict[str, float]:
        """Flat metric names, as logged: `greedy_accuracy`, `pass@k`, `maj@k`."""
        return {
            "greedy_accuracy": self.greedy_accuracy,
            **{f"pass@{k}": value for k, value in self.pass_at_k.items()},
            **{f"maj@{k}": value for k, value in self.maj_at_k.items()},
        }


@torch.no_grad()
def generate_completions(
    model,
    tokenizer,
    prompts: Sequence[str],
    samples_per_prompt: int = 1,
    temperature: float = 0.0,
    max_new_tokens: int = 8,
    batch_size: int = 256,
    seed: int = 1234,
) -> list[list[str]]:
    """`samples_per_prompt` completions of each prompt (greedy when `temperature` is 0), with a fixed sampling seed."""
    was_training = model.training
    model.eval()
    rows = [prompt for prompt in prompts for _ in range(samples_per_prompt)]
    sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0} if temperature else {}
    texts = []
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        for start in range(0, len(rows), batch_size):
            inputs = tokenizer(rows[start : start + batch_size], return_tensors="pt", padding=True).to(model.device)
            output = model.generate(
                **inputs,
                **({"do_sample": False} | sampling),
                max_new_tokens=max_new_tokens,
                pad_token_id=tokenizer.pad_token_id,
            )
            texts += tokenizer.batch_decode(output[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    model.train(was_training)
    return [texts[i : i + samples_per_prompt] for i in range(0, len(texts), samples_per_prompt)]


def coverage_report(
    model,
    tokenizer,
    prompts: Sequence[str],
    references: Sequence[str],
    extract_answer: Callable[[str], str | None],
    ks: Sequence[int] = (1, 4, 16),
    samples_per_prompt: int = 16,
    temperature: float = 1.0,
    max_new_tokens: int = 8,
    seed: int = 1234,
) -> CoverageReport:
    """Greedy accuracy, and Pass@k and Maj@k over `samples_per_prompt` sampled completions of every prompt."""
    if max(ks) > samples_per_prompt:
        raise ValueError(f"ks={list(ks)} but samples_per_prompt={samples_per_prompt}: sample at least max(ks) times.")
    greedy = generate_completions(model, tokenizer, prompts, max_new_tokens=max_new_tokens)
    sampled = generate_completions(
        model, tokenizer, prompts, samples_per_prompt, temperature, max_new_tokens, seed=seed
    )
    greedy_correct = [extract_answer(texts[0]) == ref for texts, ref in zip(greedy, references, strict=True)]
    answers = [[extract_answer(text) for text in texts] for texts in sampled]
    correct = [sum(answer == ref for answer in row) for row, ref in zip(answers, references, strict=True)]
    n = len(prompts)
    return CoverageReport(
        greedy_accuracy=sum(greedy_correct) / n,
        pass_at_k={k: sum(pass_at_k(samples_per_prompt, c, k) for c in correct) / n for k in ks},
        maj_at_k={k: sum(maj_at_k(row, ref, k) for row, ref in zip(answers, references, strict=True)) / n for k in ks},
        num_prompts=n,
        samples_per_prompt=samples_per_prompt,
    )
