"""The one place that turns a configuration into a population: the master (which parameters evolve, how they are
perturbed) and the backend that generates with its members.

| generation               | `perturbation="full"`                    | `perturbation="lowrank"`                     |
| ------------------------ | ---------------------------------------- | -------------------------------------------- |
| `model.generate`         | `HFBackend`: weights written, one by one | `HFLowRankBackend`: hooks, one batched call  |
| vLLM, `colocate`         | `VLLMColocateBackend`: weights written   | `VLLMLoRAPopulationBackend`: LoRA adapters   |
| vLLM, `server`           | `VLLMServerBackend`: seeds over HTTP     | refused                                      |

A process that drives several servers spreads its members over them (`VLLMServerPool`).

Wherever members are not written into the trainer's model, the model only ever holds the centre, so its float32
parameters are their own master (no second float32 copy of the model).
"""

from __future__ import annotations

import itertools
import tempfile
from collections.abc import Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch

from ..compat.trl import lora_enabled_llm, vllm_server_hidden_from_grpo
from ..core.compensated import CompensatedMasterWeights
from ..core.direction_optimizer import DirectionOptimizer, DirectionOptimizerSettings
from ..core.lowrank import LowRankMasterWeights
from ..core.master import MasterWeights
from ..core.released_weights import full_shape, is_released, release
from ..core.sharded_master import ShardedMasterWeights
from ..core.update_shards import EngineShards, UpdateShards
from .base import PopulationBackend
from .hf import HFBackend, TokenIds
from .hf_lowrank import HFLowRankBackend


@dataclass
class Population:
    """The centre of an ES run (the float32 master, with sigma) and the backend that evaluates its members.

    `parameters` are the trainer's model's evolving parameters, which hold the centre between steps: checkpoints
    save them, evaluation and callbacks read them (a process that released them, [`release_model_weights`], keeps
    none). `update_shards`, with several processes, shares computing the update between them (None: each process
    computes all of it).
    """

    master: MasterWeights
    backend: PopulationBackend
    parameters: dict[str, torch.nn.Parameter]
    update_shards: UpdateShards | None = None

    @torch.no_grad()
    def apply_update(self, coefficients: dict[int, float], lr: float, weight_decay: float) -> float:
        """Move the centre by `lr * sum_seed coef * eps(seed)` (with decoupled weight decay) in the master, the
        trainer's model and the backend; returns the norm of the step."""
        update_norm = self.master.apply_update(
            coefficients, lr=lr, weight_decay=weight_decay, shards=self.update_shards
        )
        self.master.write_centre_into(self.parameters)  # from each tensor's owner where the master is split
        self.backend.after_update(coefficients, lr=lr, weight_decay=weight_decay)
        return update_norm


@contextmanager
def engine_setup(args):
    """Around `GRPOTrainer.__init__`: the colocated engine TRL creates gets what the backend needs (vLLM-CPU's plain
    Linear weights, LoRA slots for low-rank members), and a server is hidden from GRPO (ES talks to its own worker
    extension)."""
    lora = nullcontext()
    if args.use_vllm and args.vllm_mode == "colocate":
        from ..compat.vllm_cpu import keep_plain_linear_weights_on_cpu
        from .vllm_lora import vllm_lora_rank

        keep_plain_linear_weights_on_cpu()  # before the engine loads the model
        if args.perturbation == "lowrank":
            lora = lora_enabled_llm(vllm_lora_rank(args.lowrank_rank), max_loras=args.members_per_generate_call)
    with vllm_server_hidden_from_grpo(args), lora:
        yield


def build_population(
    args,
    model,
    tokens: TokenIds,
    llm=None,
    resumed=None,
    update_shards: UpdateShards | None = None,
    engine_group=None,
    master_group=None,
    device: torch.device | None = None,
    keep_model: bool = True,
) -> Population:
    """The master of `model`'s evolving parameters (`requires_grad=True`) and the backend `args` asks for.

    Args:
        args ([`ESConfig`]): The configuration.
        model (`PreTrainedModel`): The trainer's (unwrapped) model, holding the centre.
        tokens ([`TokenIds`]): Padding and EOS ids for `model.generate`.
        llm (`vllm.LLM`, *optional*): The colocated engine (vLLM colocate mode).
        resumed ([`~trainer.resume.ResumedRun`], *optional*): What a resume read from its checkpoint: the float32
            masters of the parameters whose model dtype rounds them, the `es_optimizer` state, and the checkpoint's
            path (a vLLM server reads it too).
        update_shards ([`UpdateShards`], *optional*): With several processes, how they share computing the update.
        engine_group (`torch.distributed.ProcessGroup`, *optional*): The processes that share a tensor-parallel
            colocated engine.
        master_group (`torch.distributed.ProcessGroup`, *optional*): The processes that split the master between
            them, each tensor's on one owner ([`ShardedMasterWeights`]): a tensor-parallel engine's, or every
            training process in server mode. None: each process holds all of it.
        device (`torch.device`, *optional*): Where the master lives and the update is computed: by default the
            model's device; the accelerator for a model kept in host memory.
        keep_model (`bool`, *optional*, defaults to `True`): `False` to release the model's evolving weights as soon
            as the master holds them ([`release_model_weights`]), before the backend is built: the master then copies
            them all, and nothing reads them again (a resume that read the masters from a checkpoint did not load
            the model's).
    """
    parameters = evolving_parameters(model)
    check_released_masters_saved(parameters, resumed.lossy_masters if resumed is not None else {})
    vllm_mode = args.vllm_mode if args.use_vllm else None
    lowrank = args.perturbation == "lowrank"
    share = (vllm_mode is not None or lowrank) and keep_model  # the model only ever holds the centre
    if lowrank and vllm_mode == "colocate":
        from .vllm_lora import lora_target_parameters

        # LoRA adapters perturb the decoder's projections; everything else stays fixed (checked at construction).
        targets = set(lora_target_parameters(model)) & set(parameters)
        master = LowRankMasterWeights(parameters, args.sigma, targets, args.lowrank_rank, "frozen", share, device)
    elif lowrank:
        master = LowRankMasterWeights.from_model(
            model, parameters, args.sigma, args.lowrank_rank, args.lowrank_other_parameters, share, device
        )
    elif master_group is not None:  # each process keeps its share of the master
        shapes = {name: full_shape(param) for name, param in parameters.items()}
        shards = EngineShards(master_group, shapes)
        master = ShardedMasterWeights(
            parameters, args.sigma, shards, share_float32=share, offload=args.offload_master, device=device
        )
    elif args.master_dtype == "compensated_bfloat16":
        master = CompensatedMasterWeights(parameters, args.sigma, share_bfloat16=share, device=device)
    else:
        master = MasterWeights(parameters, args.sigma, share_float32=share, offload=args.offload_master, device=device)
    master.optimizer = DirectionOptimizer(direction_optimizer_settings(args), offload=args.offload_master)
    if resumed is not None:
        master.load_saved(resumed.lossy_masters)  # read for the tensors this process keeps only
        master.restore_optimizer(resumed.optimizer_state, resumed.metadata, update_shards)
    if not keep_model:
        release_model_weights(master, parameters)

    if vllm_mode is None and lowrank:
        backend = HFLowRankBackend(
            model, parameters, master, tokens, args.population_batch_size, args.pad_to_multiple_of
        )
    elif vllm_mode is None:
        backend = HFBackend(model, parameters, master, tokens, args.pad_to_multiple_of)
    elif vllm_mode == "colocate":
        backend = _colocate_backend(llm, master, model, parameters, lowrank, engine_group, keep_model)
    else:
        backend = _server_backend(args, master, parameters, resumed.checkpoint if resumed is not None else None)
    backend.check_consistency(step=0)
    return Population(master, backend, parameters, update_shards)


def release_model_weights(master: MasterWeights, parameters: dict[str, torch.nn.Parameter]) -> None:
    """Let go of the model's evolving weights `parameters` in this process (`core.released_weights`) once `master`
    holds them: where vLLM engines evaluate the members, a process that saves no checkpoint needs none of them. Only
    valid with a master that shares no storage with them (built with `keep_model=False`)."""
    if master.shared:
        raise RuntimeError(
            f"The master is stored in the model's weights {sorted(master.shared)[:3]}, so they cannot be released: "
            "build the population with keep_model=False."
        )
    release(parameters)


def check_released_masters_saved(parameters: dict[str, torch.nn.Parameter], saved: Mapping[str, torch.Tensor]) -> None:
    """A master is built from the model's weights, so a released weight's master must come from `saved`, the masters
    of the checkpoint the run resumes from (read by `load_saved`); refuse one that nothing would give a value."""
    unsaved = [name for name, param in parameters.items() if is_released(param) and name not in saved]
    if unsaved:
        raise RuntimeError(
            f"The model's weight {unsaved[0]!r} (and {len(unsaved) - 1} more) was released on this process, and no "
            "resumed checkpoint holds its float32 master to build the population from. Give the weights back first "
            "(`trl_es.core.released_weights.restore`)."
        )


def direction_optimizer_settings(args) -> DirectionOptimizerSettings:
    """The optimizer on the ES direction that `args` asks for (Adam's constants are the `TrainingArguments` ones)."""
    return DirectionOptimizerSettings(
        args.es_optimizer, args.es_momentum, args.adam_beta1, args.adam_beta2, args.adam_epsilon
    )


def evolving_parameters(model) -> dict[str, torch.nn.Parameter]:
    """The parameters ES evolves: those with `requires_grad=True` (with PEFT, the adapter's)."""
    parameters = {name: param for name, param in model.named_parameters() if param.requires_grad}
    if not parameters:
        raise ValueError(
            "The model has no parameter with requires_grad=True, so ES has nothing to evolve. Unfreeze the "
            "parameters to train, or pass a `peft_config`."
        )
    return parameters


def _colocate_backend(llm, master, model, evolving, lowrank: bool, engine_group=None, keep_model: bool = True):
    from .vllm_colocate import VLLMColocateBackend
    from .vllm_lora import VLLMLoRAPopulationBackend

    if lowrank:
        backend = VLLMLoRAPopulationBackend(llm, master, tempfile.mkdtemp(prefix="trl-es-lora-"), model)
    else:
        backend = VLLMColocateBackend(llm, master, model, engine_group)
    # The engine loaded the checkpoint from disk; the run starts from the trainer's weights: the model's, where this
    # process keeps it alone; else the master's and the model's weights that do not evolve. A process that keeps no
    # model may not have loaded a resumed checkpoint's weights into it (or released them already), and the processes
    # of a tensor-parallel engine write the same ones, the master's, from the owners of its shares.
    if engine_group is None and keep_model:
        backend.load_weights(model.named_parameters())
    else:
        fixed = ((name, p) for name, p in model.named_parameters() if name not in evolving)
        backend.load_weights(itertools.chain(master.centre(dtype=backend.dtype), fixed))
    return backend


def _server_backend(args, master, parameters, resumed_from):
    from .server_urls import servers_of_process
    from .vllm_server import VLLMServerBackend
    from .vllm_server_pool import VLLMServerPool

    dtypes = {param.dtype for param in parameters.values()}
    if len(dtypes) > 1:
        raise NotImplementedError(
            f"vllm_mode='server' needs the evolving parameters in one dtype, got {sorted(map(str, dtypes))}. Load "
            "the model in a single dtype (`model_init_kwargs={'dtype': ...}`, `cast_lm_head_to_fp32=False`)."
        )
    parameter_dtype = str(dtypes.pop()).removeprefix("torch.")
    expected = master.digests()  # once for all this process's servers: collective where the processes split it
    servers = []
    for url in servers_of_process(args.vllm_server_urls, args.process_index, args.world_size):
        server = VLLMServerBackend(
            url, master, timeout=args.vllm_server_timeout, secret_file=args.vllm_server_secret_file
        )
        server.start_run(parameter_dtype=parameter_dtype, checkpoint=resumed_from, expected=expected)
        servers.append(server)
    return servers[0] if len(servers) == 1 else VLLMServerPool(servers)
