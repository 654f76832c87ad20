"""The KL anchor's probe: fixed completions the reference sampled, and each member's KL from it on them
(`trl_es.core.kl_anchor` has the estimator). Members are evaluated with `model.generate` here: the probe reads each
member's log-probabilities from the same model, one forward pass per member."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..backends.hf import HFBackend, TokenIds, completion_log_probs, hf_generate
from ..backends.sampling import SamplingSettings
from ..core.kl_anchor import mean_token_kl
from ..core.noise import Member


@dataclass
class KLProbe:
    """Prompts, the completions the reference sampled for them (temperature 1), and the reference's
    log-probability of every completion token (concatenated)."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    reference_log_probs: torch.Tensor

    @classmethod
    def sample(cls, model, tokens: TokenIds, prompt_ids: list[list[int]], max_tokens: int, seed: int) -> KLProbe:
        """The probe of `model`'s current weights (the reference): one completion of each prompt at temperature 1."""
        kwargs = SamplingSettings(max_tokens=max_tokens, temperature=1.0).generate_kwargs(
            tokens.pad, tokens.bos, list(tokens.eos)
        )
        completion_ids = hf_generate(model, prompt_ids, kwargs, tokens, seed)
        if not any(completion_ids):
            raise ValueError("The KL probe's completions are all empty: raise max_completion_length.")
        reference = completion_log_probs(model, prompt_ids, completion_ids, tokens.pad)
        return cls(prompt_ids, completion_ids, reference)

    def kl_of(self, model, pad: int) -> float:
        """KL(reference || `model`'s current weights) per probe token."""
        member = completion_log_probs(model, self.prompt_ids, self.completion_ids, pad)
        return mean_token_kl(member, self.reference_log_probs)

    def member_kl(self, backend: HFBackend, members: list[Member]) -> torch.Tensor:
        """Each member's KL from the reference, one forward pass of the probe per member; the backend holds the
        centre again afterwards (also when one fails)."""
        found = []
        try:
            for member in members:
                backend.load_member(member)
                found.append(self.kl_of(backend.model, backend.tokens.pad))
        finally:
            backend.load_center()
        return torch.tensor(found, dtype=torch.float64)
