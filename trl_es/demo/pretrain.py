"""Train the embedded demo model from scratch: a small Qwen2 that can do a little arithmetic, so ES has work to do.

    python -m trl_es.demo.pretrain --output_dir trl_es/demo/model

Supervised next-token training on the `pretrain` split of `trl_es.tasks.arithmetic` (loss on the answer tokens only),
stopped early on purpose: the model answers a fraction of held-out problems, and ES then raises that fraction with the
verifier's reward alone. Deterministic: a fixed seed, one thread and a fixed number of steps give the same weights
bit for bit with the same torch build (a few minutes on one CPU core).
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from ..tasks.arithmetic import problem, prompt_of
from ..testing import build_tiny_qwen2, build_tiny_tokenizer

TOKENIZER_CORPUS_SIZE = 2000
MISREAD_FRACTION = 0.5


def written_answer(index: int) -> int:
    """The answer the pretraining text gives to problem `index`: a careless solver misreads the operation half of the
    time, so the model learns both readings and the verifier's reward has something to choose between."""
    drawn = problem("pretrain", index)
    misread = random.Random(f"misread-{index}").random() < MISREAD_FRACTION
    return drawn.misread_answer if misread else drawn.answer


def training_texts(tokenizer, size: int, seed: int) -> list[tuple[list[int], int]]:
    """(token ids, number of prompt tokens) of `size` pretraining problems."""
    examples = []
    for index in range(size):
        prompt_ids = tokenizer(prompt_of(problem("pretrain", index).question))["input_ids"]
        examples.append(completion_example(tokenizer, prompt_ids, f" {written_answer(index)}"))
    random.Random(seed).shuffle(examples)
    return examples


def completion_example(tokenizer, prompt_ids: list[int], completion: str) -> tuple[list[int], int]:
    """(token ids, number of prompt tokens) of a prompt followed by `completion` and EOS; the loss falls on the
    completion."""
    return prompt_ids + tokenizer(completion)["input_ids"] + [tokenizer.eos_token_id], len(prompt_ids)


def supervised_batch(examples: list[tuple[list[int], int]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-padded inputs with labels on the completion tokens only (after each example's prompt)."""
    return masked_batch(
        [(ids, [0] * prompt_length + [1] * (len(ids) - prompt_length)) for ids, prompt_length in examples],
        pad_token_id,
    )


def masked_batch(examples: list[tuple[list[int], list[int]]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-padded inputs with labels where each example's loss mask (one 0/1 per token) is 1."""
    length = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), length), pad_token_id)
    labels = torch.full((len(examples), length), -100)
    attention_mask = torch.zeros((len(examples), length), dtype=torch.long)
    for row, (ids, mask) in enumerate(examples):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, : len(ids)] = torch.where(torch.tensor(mask, dtype=torch.bool), torch.tensor(ids), -100)
        attention_mask[row, : len(ids)] = 1
    return {"input_ids": input_ids, "labels": labels, "attention_mask": attention_mask}


@contextmanager
def torch_threads(count: int | None) -> Iterator[None]:
    """`count` torch threads inside (None: as they are), restored afterwards, also on an error: pretraining runs on
    one (a fixed reduction order: the same weights on every run), and a lab run inside another process (a test, a
    notebook) leaves that process's thread count as it found it."""
    threads = torch.get_num_threads()
    if count:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def train_supervised(
    model,
    examples: list,
    pad_token_id: int,
    max_steps: int,
    batch_size: int,
    learning_rate: float,
    log=print,
    make_batch=None,
    decay: bool = False,
) -> None:
    """Next-token training on `examples` (taken in order, cycling), batched by `make_batch(examples, pad_token_id)`
    (default `supervised_batch`: (ids, prompt length) pairs, the loss on the completions): AdamW with 100 warm-up
    steps (then, with `decay`, a linear decay to a tenth of `learning_rate`) and gradient clipping, on one thread so
    that the weights are the same on every run."""
    make_batch = make_batch or supervised_batch
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.0)

    def rate(step: int) -> float:
        warmup = (step + 1) / 100
        return min(warmup, 1.0 - 0.9 * step / max(max_steps, 1)) if decay else min(1.0, warmup)

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, rate)
    model.train()
    with torch_threads(1):
        for step in range(max_steps):
            start = (step * batch_size) % (len(examples) - batch_size)
            loss = model(**make_batch(examples[start : start + batch_size], pad_token_id)).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            if (step + 1) % 100 == 0:
                log(f"step {step + 1}/{max_steps}  loss {loss.item():.4f}")
    model.eval()


def pretrain(
    output_dir: str | Path,
    max_steps: int = 4000,
    batch_size: int = 64,
    learning_rate: float = 3e-3,
    num_examples: int = 50_000,
    hidden_size: int = 128,
    num_hidden_layers: int = 4,
    seed: int = 0,
    log=print,
) -> Path:
    """Build the tokenizer and model, train them for `max_steps` and save both to `output_dir`."""
    corpus = [prompt_of(problem("pretrain", i).question) for i in range(TOKENIZER_CORPUS_SIZE)]
    corpus += [f" {number}" for number in range(100)]
    tokenizer = build_tiny_tokenizer(vocab_size=512, corpus=corpus, individual_digits=True)
    model = build_tiny_qwen2(tokenizer, seed=seed, hidden_size=hidden_size, num_hidden_layers=num_hidden_layers)
    examples = training_texts(tokenizer, num_examples, seed)
    train_supervised(model, examples, tokenizer.pad_token_id, max_steps, batch_size, learning_rate, log)
    return save_model_and_tokenizer(model, tokenizer, output_dir)


def save_model_and_tokenizer(model, tokenizer, output_dir: str | Path) -> Path:
    output_dir = Path(output_dir)
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    return output_dir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", required=True, help="Where to save the model and tokenizer.")
    parser.add_argument(
        "--max_steps", type=int, default=4000, help="Optimizer steps (the model stops early on purpose)."
    )
    parser.add_argument("--seed", type=int, default=0, help="Seed of the initialisation and the data order.")
    args = parser.parse_args(argv)
    pretrain(args.output_dir, max_steps=args.max_steps, seed=args.seed)


if __name__ == "__main__":
    main()
