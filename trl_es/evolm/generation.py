"""Text in, text out: one completion per prompt from a model, as the phases' datasets, the diagnostics and the
reward-hacking probe generate them (`model.generate`, batched, seeded so that a rebuilt dataset is the same)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import torch

from ..backends.hf import TokenIds, hf_generate
from ..backends.sampling import SamplingSettings
from ..core.noise import derive_seed
from ..trainer.rollouts import tokenize_prompts
from .pairs import Generate


def text_generator(
    model,
    tokenizer,
    max_tokens: int,
    temperature: float,
    seed_parts: tuple,
    as_prompt: Callable[[str], object] = lambda text: text,
    batch_size: int = 64,
) -> Generate:
    """`generate(texts)`: one completion of each text from `model` at `temperature` (0: greedy), decoded.

    Call `k` samples from `derive_seed(*seed_parts, k)` (batch `b` of it from that seed plus the batch's first row), so
    the same sequence of calls gives the same completions. `as_prompt` turns a text into what the tokenizer reads (a
    conversation when it has a chat template)."""
    tokens = TokenIds.of(model, tokenizer)
    kwargs = SamplingSettings(max_tokens=max_tokens, temperature=temperature).generate_kwargs(
        tokens.pad, tokens.bos, list(tokens.eos)
    )
    calls = itertools.count()

    @torch.no_grad()
    def generate(texts: Sequence[str]) -> list[str]:
        prompt_ids = tokenize_prompts(tokenizer, [as_prompt(text) for text in texts])
        seed = derive_seed(*seed_parts, next(calls))
        completions = []
        for start in range(0, len(prompt_ids), batch_size):
            ids = hf_generate(model, prompt_ids[start : start + batch_size], kwargs, tokens, seed + start)
            completions += tokenizer.batch_decode(ids, skip_special_tokens=True)
        return completions

    return generate
