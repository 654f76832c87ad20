"""The Hugging Face backend: each member's weights are written into the trainer's model, which generates with
`model.generate` exactly as `GRPOTrainer` does without vLLM (same generation config, padding and EOS handling)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import GenerationConfig, LogitsProcessorList

from ..core.master import MasterWeights
from ..core.noise import Member
from .base import OneMemberAtATime
from .gumbel import row_seeded_sampling
from .sampling import SamplingSettings


@dataclass(frozen=True)
class TokenIds:
    """The special tokens generation needs: padding, BOS, and every id that ends a completion."""

    pad: int
    bos: int | None
    eos: tuple[int, ...]

    @classmethod
    def of(cls, model, tokenizer) -> TokenIds:
        """As `GRPOTrainer` gathers them: the tokenizer's EOS first, then the model's generation-config EOS ids."""
        configured = model.generation_config.eos_token_id
        configured = [] if configured is None else [configured] if isinstance(configured, int) else list(configured)
        eos = configured if tokenizer.eos_token_id in configured else [tokenizer.eos_token_id, *configured]
        return cls(tokenizer.pad_token_id, tokenizer.bos_token_id, tuple(eos))

    @property
    def end_ids(self) -> set[int]:
        """The ids a completion that was not truncated ends with: an EOS id, or padding."""
        return {*self.eos, self.pad}


def left_padded(
    rows: list[list[int]], pad_id: int, device, pad_to_multiple_of: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """`input_ids` and `attention_mask` of token-id rows, padded on the left for generation."""
    width = max(len(row) for row in rows)
    if pad_to_multiple_of:
        width = -(-width // pad_to_multiple_of) * pad_to_multiple_of
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for i, row in enumerate(rows):
        input_ids[i, width - len(row) :] = torch.tensor(row, dtype=torch.long)
        attention_mask[i, width - len(row) :] = 1
    return input_ids.to(device), attention_mask.to(device)


def until_eos(token_ids: list[int], eos_ids: set[int] | Sequence[int]) -> list[int]:
    """The generated tokens up to and including the first EOS (what follows is padding)."""
    for position, token in enumerate(token_ids):
        if token in eos_ids:
            return token_ids[: position + 1]
    return token_ids


@torch.no_grad()
def hf_generate(
    model,
    prompt_ids: list[list[int]],
    generation_kwargs: dict,
    tokens: TokenIds,
    seed: int | None,
    pad_to_multiple_of: int | None = None,
    logits_processor: LogitsProcessorList | None = None,
) -> list[list[int]]:
    """`model.generate` over token-id rows (left-padded), in eval mode, with the global generator seeded by `seed`
    (and restored afterwards); returns each row's completion up to its first EOS."""
    input_ids, attention_mask = left_padded(prompt_ids, tokens.pad, model.device, pad_to_multiple_of)
    config = GenerationConfig(**generation_kwargs, disable_compile=True)
    was_training = model.training
    model.eval()
    devices = [model.device] if model.device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices):
            if seed is not None:
                torch.manual_seed(seed)
            output = model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                generation_config=config,
                logits_processor=logits_processor,
            )
    finally:
        model.train(was_training)
    eos = set(tokens.eos)
    return [until_eos(row, eos) for row in output[:, input_ids.shape[1] :].tolist()]


@torch.no_grad()
def completion_log_probs(
    model, prompt_ids: list[list[int]], completion_ids: list[list[int]], pad: int, batch_size: int = 32
) -> torch.Tensor:
    """The log-probability `model` gives each completion token after its prompt (and the completion's earlier
    tokens), all rows' tokens concatenated in order. Rows are right-padded, so every token keeps its position."""
    was_training = model.training
    model.eval()
    found = []
    try:
        for start in range(0, len(prompt_ids), batch_size):
            prompts, completions = prompt_ids[start : start + batch_size], completion_ids[start : start + batch_size]
            rows = [prompt + completion for prompt, completion in zip(prompts, completions, strict=True)]
            width = max(map(len, rows))
            input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
            attention_mask = torch.zeros_like(input_ids)
            for row, ids in enumerate(rows):
                input_ids[row, : len(ids)] = torch.tensor(ids)
                attention_mask[row, : len(ids)] = 1
            logits = model(input_ids=input_ids.to(model.device), attention_mask=attention_mask.to(model.device)).logits
            log_probs = torch.log_softmax(logits.float(), dim=-1)
            for row, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
                # The token at position t is predicted by the logits at t - 1.
                positions = torch.arange(len(prompt) - 1, len(prompt) + len(completion) - 1, device=logits.device)
                targets = torch.tensor(completion, device=logits.device)
                found.append(log_probs[row, positions, targets].cpu())
    finally:
        model.train(was_training)
    return torch.cat(found) if found else torch.zeros(0)


class HFBackend(OneMemberAtATime):
    """Full-rank members evaluated one at a time by the trainer's own model: a member's weights
    `cast(master + sign * sigma * eps)` are written into the evolving parameters, the model generates, and the centre
    is copied back from the master.

    Args:
        model (`PreTrainedModel`): The trainer's (unwrapped) model.
        parameters (`dict[str, torch.nn.Parameter]`): Its evolving parameters, by the master's names.
        master ([`MasterWeights`]): The float32 source of truth.
        tokens ([`TokenIds`]): Padding and EOS ids.
        pad_to_multiple_of (`int`, *optional*): As `GRPOConfig.pad_to_multiple_of`.
    """

    def __init__(
        self,
        model,
        parameters: dict[str, torch.nn.Parameter],
        master: MasterWeights,
        tokens: TokenIds,
        pad_to_multiple_of: int | None = None,
    ):
        self.model = model
        self.parameters = parameters
        self.master = master
        self.tokens = tokens
        self.pad_to_multiple_of = pad_to_multiple_of

    def generate_center(self, prompt_ids, sampling, seed):
        """Completions with the weights the model holds (the centre, between calls)."""
        return self._generate(prompt_ids, sampling, seed)

    def generate_loaded_rows(
        self, prompt_ids: list[list[int]], seeds: list[int | None], sampling: SamplingSettings
    ) -> list[list[int]]:
        """Completions with the weights the model holds, row `i` sampled with `seeds[i]` through `RowSeededGumbel`
        (the same random numbers whatever else is in the batch); an unseeded row draws its seed from torch's global
        generator."""
        if sampling.temperature == 0:
            return self._generate(prompt_ids, sampling, None)
        seeds = [int(torch.randint(2**62, ())) if seed is None else seed for seed in seeds]
        processors = row_seeded_sampling(seeds, sampling.temperature, sampling.top_k, sampling.top_p, sampling.min_p)
        # The processors sample; `generate` takes their argmax.
        kwargs = sampling.with_(temperature=0).generate_kwargs(self.tokens.pad, self.tokens.bos, list(self.tokens.eos))
        return hf_generate(self.model, prompt_ids, kwargs, self.tokens, None, self.pad_to_multiple_of, processors)

    def after_update(self, coefficients: dict[int, float], lr: float, weight_decay: float) -> None:
        """Nothing to do: the population writes the new centre into the trainer's model, which this backend reads."""

    def check_consistency(self, step: int) -> None:
        """Nothing to compare: generation reads the trainer's model, which the master writes."""

    def load_center(self) -> None:
        self.load_weights(self.master.tensors.items())

    def load_member(self, member: Member) -> None:
        """Write one member's weights (for callers that generate themselves; `load_center` undoes it)."""
        self.load_weights(self.master.perturbed(member))

    @torch.no_grad()
    def load_weights(self, named_tensors) -> None:
        """Write `(name, tensor)` pairs into the evolving parameters (e.g. a run's starting weights; `load_center`
        undoes it)."""
        for name, value in named_tensors:
            self.parameters[name].copy_(value)

    def _generate(self, prompt_ids: list[list[int]], sampling: SamplingSettings, seed: int | None):
        kwargs = sampling.generate_kwargs(self.tokens.pad, self.tokens.bos, list(self.tokens.eos))
        return hf_generate(self.model, prompt_ids, kwargs, self.tokens, seed, self.pad_to_multiple_of)
