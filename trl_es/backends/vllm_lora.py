"""vLLM colocate backend for low-rank (EGGROLL) populations: every member is a LoRA adapter, the whole population
one `llm.generate` call (vLLM's multi-LoRA batching).

A member perturbs each Linear weight `W` (`out x in`) by `sign * sigma * A @ B.T / sqrt(r)` (see `lowrank.py`), which
is exactly a LoRA adapter whose product `lora_B @ lora_A` is that matrix:

- `lora_A.weight = B.T` (`r x in`), `lora_B.weight = sign * sigma / sqrt(r) * A` (`out x r`);
- `lora_alpha = r` and `use_rslora = False`, so vLLM's (and PEFT's) scaling `lora_alpha / r` is 1.

The engine's base weights hold the centre (the master, loaded with `load_weights` after every update, as in the
colocate backend); the adapters add each member's perturbation in the forward pass. vLLM's LoRA covers the Linear
layers of the decoder only (q/k/v/o, gate/up/down; it fuses qkv and gate_up itself), so every parameter the master
perturbs must be such a weight: embeddings, `lm_head`, norms and biases stay frozen (`check_lora_population`).

Adapters are written as PEFT checkpoints (safetensors + `adapter_config.json`) under `adapter_dir`, one folder per
member, and deleted once the call returns. vLLM 0.32 loads adapters only from a path (`LoRARequest.lora_path` is
required, the worker reads it with `LoRAModel.from_local_checkpoint`); files also work under tensor parallelism, where
every worker slices the adapter itself. Each adapter gets a process-wide `lora_int_id` (and name) never used before,
so no adapter cache of vLLM can serve the factors of an older step, and prompts carry the base weights' `cache_salt`.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import shutil
import typing
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from ..lowrank import LowRankMasterWeights, lowrank_factors
from ..noise import Member
from .sampling import SamplingSettings
from .vllm_colocate import VLLMColocateBackend

# The per-module names of the Linear layers that vLLM's LoRA targets in Llama-style decoders (Llama, Qwen2, Mistral):
# vLLM merges q/k/v into `qkv_proj` and gate/up into `gate_up_proj` and splits the adapter itself.
LORA_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

# Every adapter ever written in this process gets a new id: vLLM caches adapters by id (and the prefix cache keys
# blocks by adapter name), so an id used once must never come back with other factors.
_adapter_ids = itertools.count(1)


def lora_target_parameters(model: nn.Module, target_modules: Sequence[str] = LORA_TARGET_MODULES) -> list[str]:
    """The names (as in `model.named_parameters()`) of the weights that a vLLM LoRA adapter can perturb: the weights of
    the `nn.Linear` modules called one of `target_modules` (the decoder's projections; never `lm_head`).

    These are the parameters that evolve with [`VLLMLoRAPopulationBackend`]; freeze every other one
    (`requires_grad=False`) or keep it out of the master.
    """
    names = []
    for module_name, module in model.named_modules():
        if isinstance(module, nn.Linear) and module_name.rsplit(".", 1)[-1] in target_modules:
            names.append(f"{module_name}.weight")
    return names


def check_lora_population(master: LowRankMasterWeights, target_modules: Sequence[str] = LORA_TARGET_MODULES) -> None:
    """Raise a `ValueError` unless every parameter that `master` perturbs is a low-rank weight of a Linear layer that
    vLLM's LoRA targets (see [`lora_target_parameters`])."""
    if not isinstance(master, LowRankMasterWeights):
        raise ValueError(
            f"The vLLM LoRA population backend evaluates low-rank members only, got a {type(master).__name__}. Use "
            "perturbation='lowrank', or the colocate backend (members' weights written into the engine)."
        )
    targets = {f".{module}.weight" for module in target_modules}
    offending = [
        name
        for name in master.tensors
        if not master.is_frozen(name)
        and not (name in master.lowrank_names and any(name.endswith(suffix) for suffix in targets))
    ]
    if offending:
        # One entry per kind of parameter: `model.layers.*.input_layernorm.weight` stands for every layer's.
        shown = ", ".join(dict.fromkeys(re.sub(r"\.\d+\.", ".*.", name) for name in offending))
        raise ValueError(
            f"vLLM LoRA adapters can only perturb the decoder's Linear weights ({', '.join(target_modules)}), but the "
            f"population also perturbs {shown}. Freeze these parameters (requires_grad=False, e.g. keep only "
            "`lora_target_parameters(model)` trainable) or build the master with other_parameters='frozen' and only "
            "those weights low-rank; or generate with model.generate (use_vllm=False), which perturbs every parameter."
        )


def vllm_lora_rank(rank: int) -> int:
    """The smallest `max_lora_rank` that vLLM accepts (it takes a fixed set of values) and that fits `rank`."""
    try:
        from vllm.config.lora import MaxLoRARanks

        allowed = sorted(typing.get_args(MaxLoRARanks))
    except ImportError:  # another vLLM layout: trust the rank as it is
        return rank
    fitting = [value for value in allowed if value >= rank]
    if not fitting:
        raise ValueError(f"vLLM's LoRA supports ranks up to {allowed[-1]}, got lowrank rank={rank}.")
    return fitting[0]


@contextmanager
def lora_enabled_llm(max_lora_rank: int, max_loras: int) -> Iterator[None]:
    """Within this context, the colocated engine that TRL's `VLLMGeneration` creates has LoRA enabled.

    TRL builds its `vllm.LLM` inside `VLLMGeneration._init_vllm` (called from `GRPOTrainer.__init__`) without LoRA
    arguments; this replaces the `LLM` name of `trl.generation.vllm_generation` by one that adds
    `enable_lora=True, max_lora_rank=..., max_loras=...`, and restores it on exit.

    Args:
        max_lora_rank (`int`):
            The members' rank; rounded up to a rank vLLM accepts (1, 8, 16, ...).
        max_loras (`int`):
            Adapters in one batch: the members evaluated per `generate` call. A larger population is generated in
            chunks of `max_loras` members.
    """
    from trl.generation import vllm_generation

    original = vllm_generation.LLM
    lora_arguments = {"enable_lora": True, "max_lora_rank": vllm_lora_rank(max_lora_rank), "max_loras": max_loras}

    def llm_with_lora(*args, **kwargs):
        return original(*args, **{**kwargs, **lora_arguments})

    vllm_generation.LLM = llm_with_lora
    try:
        yield
    finally:
        vllm_generation.LLM = original


class VLLMLoRAPopulationBackend(VLLMColocateBackend):
    """The colocate backend, plus [`generate_population`]: all low-rank members in one call, each as a LoRA adapter.

    The engine's base weights hold the centre (`load_center`, after every update); `load_member` still writes a
    member's explicit weights, for checks.

    Args:
        llm (`vllm.LLM`): The in-process engine, created with LoRA enabled (see [`lora_enabled_llm`]).
        master ([`LowRankMasterWeights`]): The float32 source of truth; only decoder Linear weights may evolve.
        sigma (`float`): Noise scale of the members.
        sampling ([`SamplingSettings`]): Generation settings.
        adapter_dir (`str` or `Path`): Where adapters are written (a fresh subfolder per backend, so several
            processes may share it); they are deleted after each call.
    """

    def __init__(
        self, llm, master: LowRankMasterWeights, sigma: float, sampling: SamplingSettings, adapter_dir: str | Path
    ):
        check_lora_population(master)
        lora_config = llm.llm_engine.vllm_config.lora_config
        if lora_config is None:
            raise ValueError(
                "The vLLM engine was created without LoRA. Create it with enable_lora=True, max_lora_rank >= "
                f"{master.rank} and max_loras >= members per call (wrap the trainer's creation in `lora_enabled_llm`)."
            )
        if master.rank > lora_config.max_lora_rank:
            raise ValueError(
                f"The members' rank {master.rank} exceeds the engine's max_lora_rank={lora_config.max_lora_rank}; "
                f"create the engine with max_lora_rank={vllm_lora_rank(master.rank)}."
            )
        super().__init__(llm, master, sigma, sampling)
        self.max_loras = lora_config.max_loras
        self.lora_dtype = lora_config.lora_dtype  # written in the dtype vLLM casts to: half the bytes in bf16
        self.adapter_dir = Path(adapter_dir) / f"es-lora-{uuid.uuid4().hex[:12]}"
        self.lora_names = [name for name in master.tensors if not master.is_frozen(name)]
        self.target_modules = sorted({name.rsplit(".", 2)[-2] for name in self.lora_names})

    def generate_population(
        self, prompt_ids: list[list[int]], members: Sequence[Member], seed: int | None
    ) -> list[list[int]]:
        """Completions of every member for `prompt_ids`, member-major: row `i * len(prompt_ids) + j` is member `i`'s
        completion of prompt `j`. Row `j` of every member samples with seed `seed + j` (common random numbers).

        At most `max_loras` members share one `generate` call; a larger population takes several.
        """
        completions = []
        for start in range(0, len(members), self.max_loras):
            completions += self._generate_chunk(prompt_ids, members[start : start + self.max_loras], seed)
        return completions

    def _generate_chunk(self, prompt_ids: list[list[int]], members: Sequence[Member], seed: int | None):
        from vllm import SamplingParams

        rows = len(prompt_ids)
        # Member-major; every member's j-th row samples with seed + j (common random numbers).
        prompts = [{"prompt_token_ids": ids, "cache_salt": self.weights_tag} for _ in members for ids in prompt_ids]
        params = [SamplingParams(**self.sampling.for_row(seed, row)) for _ in members for row in range(rows)]
        with self.member_adapters(members) as requests:
            loras = [request for request in requests for _ in range(rows)]
            outputs = self.llm.generate(prompts, params, lora_request=loras, use_tqdm=False)
        return [list(output.outputs[0].token_ids) for output in outputs]

    @contextmanager
    def member_adapters(self, members: Sequence[Member]) -> Iterator[list]:
        """The `vllm.lora.request.LoRARequest` of each member, written to disk for the duration of the context (for a
        caller that builds its own `generate` call, e.g. to ask for log-probabilities).

        Every adapter gets an id never used before in this process; an antithetic pair's factors are drawn once.
        Leaving the context deletes the files: vLLM keeps the adapters it loaded in memory, and no later request
        names these ids again.
        """
        from vllm.lora.request import LoRARequest

        factors: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
        requests = []
        try:
            for member in members:
                adapter_id = next(_adapter_ids)
                path = self.adapter_dir / f"member-{adapter_id}"
                tensors = {}
                for name in self.lora_names:
                    master = self.master.tensors[name]
                    if (member.seed, name) not in factors:
                        # Drawn on the master's device, as the update draws them (CPU and CUDA generators differ).
                        a, b = lowrank_factors(member.seed, name, master.shape, self.master.rank, master.device)
                        factors[member.seed, name] = a.cpu(), b.cpu()
                    a, b = factors[member.seed, name]
                    key = "base_model.model." + name.removesuffix(".weight")
                    scale = member.sign * self.sigma / math.sqrt(self.master.rank)
                    tensors[f"{key}.lora_A.weight"] = b.T.to(self.lora_dtype).contiguous()
                    tensors[f"{key}.lora_B.weight"] = (a * scale).to(self.lora_dtype)
                path.mkdir(parents=True)
                requests.append(LoRARequest(f"es-member-{adapter_id}", adapter_id, str(path)))
                save_file(tensors, path / "adapter_model.safetensors")
                (path / "adapter_config.json").write_text(json.dumps(self._adapter_config()))
            yield requests
        finally:
            for request in requests:
                shutil.rmtree(request.lora_path, ignore_errors=True)

    def _adapter_config(self) -> dict:
        rank = self.master.rank
        return {
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "r": rank,
            "lora_alpha": rank,  # scaling lora_alpha / r = 1: lora_B already holds sign * sigma / sqrt(r)
            "use_rslora": False,
            "target_modules": self.target_modules,
            "bias": "none",
        }
