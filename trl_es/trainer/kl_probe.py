"""The KL anchor's probe: fixed completions the reference sampled, and each member's KL from it on them
(`trl_es.core.kl_anchor` has the estimator), and how an ESTrainer samples it and anchors its members' fitness. Members
are evaluated with `model.generate` here: the probe reads each member's log-probabilities from the same model, one
forward pass per member."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from ..backends.hf import HFBackend, TokenIds, completion_log_probs, hf_generate
from ..backends.sampling import SamplingSettings
from ..compat.trl import logged_metrics
from ..core.distributed import from_process, gather_member_values, members_of_this_process
from ..core.kl_anchor import anchored_fitness, mean_token_kl
from ..core.noise import Member, derive_seed
from .rollouts import tokenize_prompts


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


def sample_trainer_probe(trainer, resumed) -> KLProbe:
    """An ESTrainer's probe, sampled by the run's starting weights (a resumed run's from its checkpoint,
    `resume.ResumedRun`) on the main process, the same on every process."""
    probe = None
    if trainer.accelerator.is_main_process:
        backend, args = trainer.population.backend, trainer.args
        prompts = trainer._kl_probe_prompts or [
            row["prompt"] for row in itertools.islice(trainer.train_dataset, args.kl_anchor_probe_size)
        ]
        template, template_kwargs = trainer.chat_template, trainer.chat_template_kwargs
        prompt_ids = tokenize_prompts(trainer.processing_class, prompts, template, template_kwargs)
        seed = derive_seed(args.member_noise_seed, "kl-probe")
        try:
            if resumed is not None:
                backend.load_weights(resumed.reference.items())
            probe = KLProbe.sample(backend.model, trainer.tokens, prompt_ids, args.max_completion_length, seed)
        finally:
            backend.load_center()
    return from_process(trainer.accelerator, probe, owner=0)


def anchored(trainer, fitness: torch.Tensor, members) -> torch.Tensor:
    """`fitness - kl_anchor_beta * KL` of every member of an ESTrainer's step from the starting weights, on its
    probe; the centre's KL is logged as `kl`, GRPO's name for the policy's KL to its reference, and the mean penalty
    as `es/kl_penalty`."""
    probe, backend, accelerator = trainer._kl_probe, trainer.population.backend, trainer.accelerator
    member_kl = gather_member_values(
        accelerator, probe.member_kl(backend, members_of_this_process(accelerator, members))
    )
    metrics, beta = logged_metrics(trainer, "train"), trainer.args.kl_anchor_beta
    metrics["kl"].append(probe.kl_of(backend.model, trainer.tokens.pad))
    metrics["es/kl_penalty"].append(beta * member_kl.mean().item())  # what the anchor took off the mean fitness
    return anchored_fitness(fitness, member_kl, beta)
