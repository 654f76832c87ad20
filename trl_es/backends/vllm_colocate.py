"""vLLM colocate backend: members are written into the in-process engine through vLLM's own `load_weights`.

`load_weights` takes Hugging Face names and handles vLLM's fused (qkv, gate_up) layouts and tensor-parallel shards,
so the master never needs to know the engine's layout. A tensor-parallel engine is shared by a group of processes
that evaluate the same members (`trl_es.core.distributed.Evaluators`): each writes the member's whole tensors, and
vLLM keeps its rank's shard of each.

A member must never reuse KV blocks that the prefix cache computed with other weights. Instead of resetting the cache
after every weight change (a walk over every block: about 1 ms per member for a 1 GiB cache), every load gets a fresh
tag that generation passes as vLLM's `cache_salt`: blocks computed under other weights can no longer match, and the
rows of one member (several completions of a prompt, a shared system prompt) still share theirs.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator

import torch

from ..compat.vllm import engine_model
from ..core.consistency import engine_fingerprint, layout_free_stats, stats_agree
from ..core.master import MasterWeights
from ..core.noise import Member
from ..core.released_weights import is_released
from .base import OneMemberAtATime
from .sampling import SamplingSettings, row_seeds


class VLLMColocateBackend(OneMemberAtATime):
    """Full-rank members evaluated one at a time in the trainer's process, by a `vllm.LLM` (the one TRL's
    `VLLMGeneration` built) whose weights are written for each member.

    Args:
        llm (`vllm.LLM`): The engine, created with `distributed_executor_backend="external_launcher"`.
        master ([`MasterWeights`]): The float32 source of truth.
        reference_model (`torch.nn.Module`, *optional*): The trainer's model (holding the centre, or having released
            its evolving weights: the master's stand for them), which `check_consistency` compares with the engine.
        engine_group (`torch.distributed.ProcessGroup`, *optional*): The processes that share a tensor-parallel
            engine; each holds a shard of it, and they load the same members together.
    """

    def __init__(self, llm, master: MasterWeights, reference_model: torch.nn.Module | None = None, engine_group=None):
        self.llm = llm
        self.master = master
        self.reference_model = reference_model
        self.engine_group = engine_group
        # With engine_group: the shards' fingerprints when a check found the centre loaded, and that check's step;
        # the next write into the engine compares them first.
        self._checked_centre: tuple[int, dict[str, object]] | None = None
        self.engine_model = engine_model(llm)
        self.dtype = next(self.engine_model.parameters()).dtype
        self.weights_tag = uuid.uuid4().hex  # changes with every load: the prefix cache salt

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Write Hugging Face-named tensors (any dtype) into the engine, and drop the KV blocks cached under the
        weights it held: this backend's requests carry the new `weights_tag` as their cache salt, but a user's
        rollout function generating through the engine sends none (issue 28: it read the previous member's blocks).
        Nothing cached under other weights could be used anyway. A tensor-parallel engine's shards are first compared
        with their fingerprint from the last check (see `check_consistency`)."""
        checked, self._checked_centre = self._checked_centre, None
        if checked is not None:
            self._check_shards_unchanged(*checked)
        self.engine_model.load_weights((name, tensor.to(self.dtype)) for name, tensor in named_tensors)
        self.weights_tag = uuid.uuid4().hex
        self.llm.reset_prefix_cache()

    def load_member(self, member: Member) -> None:
        self.load_weights(self.master.perturbed(member, dtype=self.dtype))

    def load_center(self) -> None:
        self.load_weights(self.master.centre(dtype=self.dtype))

    def generate_center(self, prompt_ids, sampling, seed):
        """Completions with the weights the engine holds (the centre, between calls)."""
        return self.generate_loaded_rows(prompt_ids, row_seeds(seed, len(prompt_ids)), sampling)

    def generate_loaded_rows(
        self, prompt_ids: list[list[int]], seeds: list[int | None], sampling: SamplingSettings
    ) -> list[list[int]]:
        """Completions with the weights the engine holds, row `i` sampled with `seeds[i]` (vLLM seeds each request's
        own generator, so a row samples alike whatever else is in the batch).

        The processes of a tensor-parallel engine generate together, so they must send it the same requests: in
        training they ask for the same rows; where each asks for its own (evaluation shards its dataset), the engine
        generates all of them and each process keeps its own."""
        if self.engine_group is None:
            return self._generate(prompt_ids, seeds, sampling)
        per_rank = [None] * torch.distributed.get_world_size(self.engine_group)
        torch.distributed.all_gather_object(per_rank, (prompt_ids, seeds), group=self.engine_group)
        if all(rows == per_rank[0] for rows in per_rank):
            return self._generate(prompt_ids, seeds, sampling)
        completions = self._generate(
            [ids for rank_ids, _ in per_rank for ids in rank_ids],
            [seed for _, rank_seeds in per_rank for seed in rank_seeds],
            sampling,
        )
        first = sum(len(rank_ids) for rank_ids, _ in per_rank[: torch.distributed.get_rank(self.engine_group)])
        return completions[first : first + len(prompt_ids)]

    def _generate(self, prompt_ids, seeds, sampling) -> list[list[int]]:
        from vllm import SamplingParams

        params = [SamplingParams(**sampling.vllm_row_params(seed)) for seed in seeds]
        prompts = [{"prompt_token_ids": ids, "cache_salt": self.weights_tag} for ids in prompt_ids]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        return [list(output.outputs[0].token_ids) for output in outputs]

    def after_update(self, coefficients: dict[int, float], lr: float, weight_decay: float) -> None:
        self.load_center()  # the trainer's master is this engine's master

    def check_consistency(self, step: int) -> None:
        """Fail loudly if the engine does not hold the trainer's model's weights (the centre), compared layout-free.
        A tensor-parallel engine's shards are fingerprinted instead, and the next write into the engine fails loudly
        if any rank's shards changed in between (an evaluation, a callback or a user's code wrote into the engine)."""
        if self.engine_group is not None:
            self._checked_centre = (step, engine_fingerprint(self.engine_model.named_parameters()))
            return
        if self.reference_model is None:
            return
        engine = layout_free_stats(p for _, p in self.engine_model.named_parameters())
        expected = layout_free_stats(self._centre_weights(), dtype=self.dtype)
        if not stats_agree(engine, expected):
            raise RuntimeError(
                f"At step {step} the vLLM engine's weights disagree with the trainer's (sum, sum of squares: engine "
                f"{engine}, trainer {expected}). Generation no longer uses the weights being trained; please report "
                "this with your vLLM version and model."
            )

    def _centre_weights(self) -> Iterator[torch.Tensor]:
        """The weights the engine holds at the centre: the reference model's, with the master's in place of those
        this process released (`core.released_weights`: a process that saves no checkpoint keeps no model)."""
        for name, parameter in self.reference_model.named_parameters():
            # One tensor of the master at a time, and only a released one's (an offloaded master copies each read).
            yield self.master.tensors[name] if is_released(parameter) else parameter

    def _check_shards_unchanged(self, step: int, fingerprint: dict[str, object]) -> None:
        """The layout-free sums do not add up over tensor-parallel shards (a model with fewer KV heads than ranks
        holds them on every rank), so each rank compares its shards with their `fingerprint` from the check of `step`,
        just before the engine is written again (the check itself follows a load of the centre: comparing there would
        find nothing); every rank of the group raises together."""
        changed = [
            name
            for name, value in engine_fingerprint(self.engine_model.named_parameters()).items()
            if fingerprint.get(name) != value
        ]
        per_rank = [None] * torch.distributed.get_world_size(self.engine_group)
        torch.distributed.all_gather_object(per_rank, changed, group=self.engine_group)
        if any(per_rank):
            rank, names = next((rank, names) for rank, names in enumerate(per_rank) if names)
            raise RuntimeError(
                f"After step {step} the tensor-parallel vLLM engine's shards changed while they held the centre (rank "
                f"{rank} of the engine: {names[:3]}): something other than ESTrainer (a callback, an evaluation, a "
                "rollout function) wrote into the engine, so what it generated since did not use the weights being "
                "trained. Write members through the trainer's backend (`member.generate` in a rollout function)."
            )
