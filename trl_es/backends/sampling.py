"""The sampling settings of one generation call, in the form each engine takes them."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

# What greedy decoding unsets in a transformers generation config (as GRPO's sampling fields would otherwise apply).
_GREEDY = {"do_sample": False, "temperature": None, "top_p": None, "top_k": None, "min_p": None}


@dataclass(frozen=True)
class SamplingSettings:
    """GRPO's generation fields. `temperature=0` decodes greedily.

    With sampling, row `i` of a call is sampled with seed `seed + i`: every member of an ES step gets the same seed
    for the same row (common random numbers), while the repeated rows of one prompt (`num_generations > 1`) differ.
    `extra` is `GRPOConfig.generation_kwargs`: vLLM `SamplingParams` or `generate` keyword arguments.
    """

    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float = 1.0
    cache_implementation: str | None = None
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_config(cls, args) -> SamplingSettings:
        """The training settings of a `GRPOConfig` (or `ESConfig`)."""
        return cls(
            max_tokens=args.max_completion_length,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            min_p=args.min_p,
            repetition_penalty=args.repetition_penalty,
            cache_implementation=args.cache_implementation,
            extra=dict(args.generation_kwargs or {}),
        )

    def with_(self, **changes) -> SamplingSettings:
        return replace(self, **changes)

    def vllm_params(self, seed: int | None, row: int) -> dict:
        """Keyword arguments of `vllm.SamplingParams` (or of an OpenAI completion request) for row `row` of a call
        seeded with `seed` (the row samples with `seed + row`)."""
        return self.vllm_row_params(None if seed is None else seed + row)

    def vllm_row_params(self, seed: int | None) -> dict:
        """Keyword arguments of `vllm.SamplingParams` (or of an OpenAI completion request) for a row sampled with its
        own `seed` (None: unseeded). Greedy decoding sends no seed."""
        settings = {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k or 0,
            "min_p": self.min_p or 0.0,
            "repetition_penalty": self.repetition_penalty,
            **self.extra,
        }
        if self.temperature > 0 and seed is not None:
            settings["seed"] = seed
        return settings

    def generate_kwargs(self, pad_token_id: int, bos_token_id: int | None, eos_token_ids: list[int]) -> dict:
        """Keyword arguments of a `transformers.GenerationConfig`, as `GRPOTrainer` builds its own (greedy decoding
        unsets the sampling fields)."""
        kwargs = {
            "max_new_tokens": self.max_tokens,
            "do_sample": True,
            "pad_token_id": pad_token_id,
            "bos_token_id": bos_token_id,
            "eos_token_id": eos_token_ids,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "repetition_penalty": self.repetition_penalty,
            "cache_implementation": self.cache_implementation,
            **self.extra,
        }
        return kwargs | _GREEDY if self.temperature == 0 else kwargs


def row_seeds(seed: int | None, rows: int) -> list[int | None]:
    """The seed of each row of a call seeded with `seed`: `seed + row` (common random numbers), or None (unseeded)."""
    return [None if seed is None else seed + row for row in range(rows)]
