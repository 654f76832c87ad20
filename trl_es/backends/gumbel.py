"""Sampling in `model.generate` with random numbers of our choosing (the Gumbel-max trick).

`argmax(logits / temperature + g)`, with `g` standard Gumbel noise, is a sample of `softmax(logits / temperature)`. A
logits processor adds the noise and generation takes the argmax (`do_sample=False`), so which numbers a row samples
with is decided here rather than by the one random stream `generate` draws for its whole batch:

- [`CommonRandomGumbel`]: a batched population, member-major: every member's `j`-th row draws the same numbers
  (`HFLowRankBackend.generate`);
- [`RowSeededGumbel`]: every row its own seed; a row's numbers depend on its seed and on how many tokens it has
  generated in this call, never on the other rows or the padded width (`generate_rows` of the HF backends).

CPU and CUDA generators draw different numbers from one seed: a row samples alike on devices of one type.
"""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Integral

import torch
from transformers import LogitsProcessor, LogitsProcessorList
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from ..core.noise import derive_seed


def _gumbel(uniform: torch.Tensor) -> torch.Tensor:
    return -torch.log(-torch.log(uniform.clamp_min(torch.finfo(uniform.dtype).tiny)))


def _check_temperature(name: str, temperature: float) -> None:
    if temperature <= 0:
        raise ValueError(f"{name} samples with temperature > 0, got temperature={temperature}.")


class CommonRandomGumbel(LogitsProcessor):
    """Sampling with common random numbers across the members of one batched population (Gumbel-max trick).

    In one `generate` call the sampler draws different random numbers for every row, so member `i`'s `j`-th row would
    not sample with the same numbers as member `k`'s `j`-th row, as the one-member-at-a-time evaluation does. This
    processor adds to row `j` the Gumbel noise of row `j % rows_per_member`, drawn from `(seed, sequence length)`, and
    generation then takes the argmax (`do_sample=False`): `argmax(logits / temperature + gumbel)` is a sample of
    `softmax(logits / temperature)`. A member evaluated alone with the same processor draws the same numbers.
    Put top-k/top-p warpers before it in the `logits_processor` list; `do_sample=False` does not add them.

    Args:
        seed (`int`):
            The step's sampling seed (see `noise.sampling_seed`).
        rows_per_member (`int`):
            Rows of each member in the batch.
        temperature (`float`, *optional*, defaults to `1.0`):
            Sampling temperature.
    """

    def __init__(self, seed: int, rows_per_member: int, temperature: float = 1.0):
        _check_temperature("CommonRandomGumbel", temperature)
        self.seed = seed
        self.rows_per_member = rows_per_member
        self.temperature = temperature

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        rows, vocab = scores.shape
        if rows % self.rows_per_member:
            raise ValueError(f"A batch of {rows} rows is not whole members of rows_per_member={self.rows_per_member}.")
        generator = torch.Generator(device=scores.device).manual_seed(derive_seed(self.seed, input_ids.shape[1]))
        uniform = torch.rand((self.rows_per_member, vocab), generator=generator, device=scores.device)
        return scores.float() / self.temperature + _gumbel(uniform).repeat(rows // self.rows_per_member, 1)


class RowSeededGumbel(LogitsProcessor):
    """Sampling where every row draws its own random numbers from its own seed (Gumbel-max trick).

    Row `r`'s noise for its `t`-th generated token is drawn from `(seeds[r], t)`: it depends neither on the other rows
    of the batch nor on the padded prompt width, so a row samples the same numbers alone or in any batch, and two rows
    with the same seed (two members' continuations of one conversation) sample with common random numbers. Use one
    processor per `generate` call: it counts tokens from the width of the first call. Put top-k/top-p warpers before
    it in the `logits_processor` list, and generate with `do_sample=False`.

    Args:
        seeds (`Sequence[int]`):
            One seed per row of the batch.
        temperature (`float`, *optional*, defaults to `1.0`):
            Sampling temperature.
    """

    def __init__(self, seeds: Sequence[int], temperature: float = 1.0):
        _check_temperature("RowSeededGumbel", temperature)
        if any(not isinstance(seed, Integral) for seed in seeds):
            raise TypeError(f"RowSeededGumbel needs an integer seed for every row, got {list(seeds)}.")
        self.seeds = [int(seed) for seed in seeds]
        self.temperature = temperature
        self.prompt_width: int | None = None  # the batch's width at the first call: no token generated yet

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        rows, vocab = scores.shape
        if rows != len(self.seeds):
            raise ValueError(
                f"RowSeededGumbel holds {len(self.seeds)} seeds for a batch of {rows} rows: give one seed per row "
                "(num_return_sequences and beam search are not supported)."
            )
        if self.prompt_width is None:
            self.prompt_width = input_ids.shape[1]
        generated = input_ids.shape[1] - self.prompt_width
        uniform = torch.stack(
            [
                torch.rand(
                    vocab,
                    generator=torch.Generator(device=scores.device).manual_seed(derive_seed(seed, "row", generated)),
                    device=scores.device,
                )
                for seed in self.seeds
            ]
        )
        return scores.float() / self.temperature + _gumbel(uniform)


def _warpers(temperature: float, top_k: int | None, top_p: float | None, min_p: float | None) -> list:
    warpers = [TemperatureLogitsWarper(temperature)]
    if top_k:
        warpers.append(TopKLogitsWarper(top_k))
    if top_p is not None and top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p))
    if min_p:
        warpers.append(MinPLogitsWarper(min_p))
    return warpers


def common_random_sampling(
    seed: int,
    rows_per_member: int,
    temperature: float,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
) -> LogitsProcessorList:
    """The logits processors that sample a batched population with common random numbers (pass them to `generate`
    with `do_sample=False`): temperature and the top-k / top-p / min-p filters, then `CommonRandomGumbel`."""
    return LogitsProcessorList(
        [*_warpers(temperature, top_k, top_p, min_p), CommonRandomGumbel(seed, rows_per_member)]
    )


def row_seeded_sampling(
    seeds: Sequence[int],
    temperature: float,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
) -> LogitsProcessorList:
    """The logits processors that sample every row with its own seed (pass them to `generate` with
    `do_sample=False`): temperature and the top-k / top-p / min-p filters, then `RowSeededGumbel`."""
    return LogitsProcessorList([*_warpers(temperature, top_k, top_p, min_p), RowSeededGumbel(seeds)])
