"""The sampling settings of one generation call, shared by the vLLM backends."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SamplingSettings:
    """GRPO's generation fields, as vLLM takes them. `temperature=0` decodes greedily.

    With sampling, row `i` of a call is sampled with seed `seed + i`: every member of an ES step gets the same seed
    for the same row (common random numbers), while the repeated rows of one prompt (`num_generations > 1`) differ.
    """

    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_trainer(cls, trainer) -> SamplingSettings:
        return cls(
            max_tokens=trainer.max_completion_length,
            temperature=trainer.temperature,
            top_p=trainer.top_p,
            top_k=trainer.top_k or 0,
            min_p=trainer.min_p or 0.0,
            repetition_penalty=trainer.repetition_penalty,
            extra=dict(trainer.args.generation_kwargs or {}),
        )

    def for_row(self, seed: int | None, row: int) -> dict:
        """Keyword arguments of `vllm.SamplingParams` (or of an OpenAI completion request) for one row."""
        settings = {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "repetition_penalty": self.repetition_penalty,
            **self.extra,
        }
        if self.temperature > 0 and seed is not None:
            settings["seed"] = seed + row
        return settings
