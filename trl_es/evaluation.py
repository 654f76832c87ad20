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
    token_entropy: float = 0.0  # mean over the sampled completions' tokens, in nats
    success_probs: list[float] = field(default_factory=list)  # per prompt: the fraction of correct samples
    num_prompts: int = 0
    samples_per_prompt: int = 0

    def as_dict(self) -> dict[str, float]:
        """Flat metric names, as logged: `greedy_accuracy`, `pass@k`, `maj@k`, `entropy`."""
        return {
            "greedy_accuracy": self.greedy_accuracy,
            **{f"pass@{k}": value for k, value in self.pass_at_k.items()},
            **{f"maj@{k}": value for k, value in self.maj_at_k.items()},
            "entropy": self.token_entropy,
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
) -> tuple[list[list[str]], float]:
    """`samples_per_prompt` completions of each prompt (greedy when `temperature` is 0), with a fixed sampling seed,
    and the policy's mean token entropy (nats, at temperature 1) over the generated tokens up to the first EOS."""
    was_training = model.training
    model.eval()
    rows = [prompt for prompt in prompts for _ in range(samples_per_prompt)]
    sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0} if temperature else {}
    texts, entropy_sum, token_count = [], 0.0, 0
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        for start in range(0, len(rows), batch_size):
            inputs = tokenizer(rows[start : start + batch_size], return_tensors="pt", padding=True).to(model.device)
            output = model.generate(
                **inputs,
                **({"do_sample": False} | sampling),
                max_new_tokens=max_new_tokens,
                pad_token_id=tokenizer.pad_token_id,
                output_logits=True,
                return_dict_in_generate=True,
            )
            completion_ids = output.sequences[:, inputs["input_ids"].shape[1] :]
            texts += tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
            log_probs = torch.stack(output.logits, dim=1).float().log_softmax(-1)
            entropy = -(log_probs.exp() * log_probs).sum(-1)
            is_eos = completion_ids == tokenizer.eos_token_id
            generated = (is_eos.cumsum(1) - is_eos.long()) == 0  # tokens up to and including the first EOS
            entropy_sum += entropy[generated].sum().item()
            token_count += generated.sum().item()
    model.train(was_training)
    completions = [texts[i : i + samples_per_prompt] for i in range(0, len(texts), samples_per_prompt)]
    return completions, entropy_sum / max(token_count, 1)


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
    greedy, _ = generate_completions(model, tokenizer, prompts, max_new_tokens=max_new_tokens)
    sampled, token_entropy = generate_completions(
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
        token_entropy=token_entropy,
        success_probs=[c / samples_per_prompt for c in correct],
        num_prompts=n,
        samples_per_prompt=samples_per_prompt,
    )
