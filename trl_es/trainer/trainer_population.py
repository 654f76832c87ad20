"""The population an ESTrainer evolves, built from its model when the run first needs it: the model's evolving weights
checked, a model kept in host memory moved there, the master and the backend (`build_population`), and the processes'
masters compared before the first member is drawn."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from ..backends.population import Population, build_population, evolving_parameters
from ..compat.trl import colocated_engine, colocated_engine_group
from ..core.checkpoint import model_weight_files
from ..core.distributed import check_ranks_agree
from ..core.guards import check_finite_tensors
from ..core.released_weights import restore
from ..core.tensor_files import TensorFiles
from ..core.update_shards import UpdateShards
from .config_checks import engine_group_size
from .resume import holds_every_master


def build_trainer_population(trainer, resumed=None) -> Population:
    """`trainer`'s population, from its model's current weights (and `resumed`'s float32 masters and `es_optimizer`
    state: `resume.ResumedRun`)."""
    args = trainer.args
    model = trainer.accelerator.unwrap_model(trainer.model)
    restore_model_weights(trainer)  # the model a process released with an earlier population
    keep_model = keeps_model(trainer)
    origin = f" (from {resumed.checkpoint})" if resumed else ""
    check_finite_tensors(evolving_parameters(model), f"The model's evolving weights{origin}")
    if args.model_in_host_memory:
        # The engine evaluates every member: the accelerator keeps the engine and the master, and the model follows
        # the centre in host memory (the copy `Population.apply_update` makes after each update). It was loaded
        # there; this moves one passed on the accelerator, before the master is built from it.
        model.to("cpu")
    population = build_population(
        args,
        model,
        trainer.tokens,
        llm=colocated_engine(trainer),
        resumed=resumed,
        update_shards=update_shards(trainer.accelerator, args),
        engine_group=colocated_engine_group(trainer),
        device=args.device if args.model_in_host_memory else None,  # else the model's
        keep_model=keep_model,
    )
    check_ranks_agree(trainer.accelerator, population.master, step=0)  # no DDP broadcast evens them
    if not keep_model:
        # The engine gets every member from the owners of the master's shares, and checkpoints are written by the
        # processes that save: the model here would be one more copy of it per process, in host memory.
        population.release_model_weights()
    return population


@contextmanager
def model_weights_held(trainer) -> Iterator[None]:
    """The model's weights on every process for the duration (coverage's entropies run the model on each), released
    again after where the population releases them."""
    restore_model_weights(trainer)
    try:
        yield
    finally:
        if not keeps_model(trainer):
            trainer.population.release_model_weights()


def keeps_model(trainer) -> bool:
    """Whether this process keeps the model's weights while it trains: a process of a tensor-parallel engine that
    saves no checkpoint lets go of them."""
    return colocated_engine_group(trainer) is None or trainer.args.should_save


def loads_checkpoint_weights(trainer, checkpoint: str) -> bool:
    """Whether a resume from `checkpoint` loads its weights into this process's model: not where the process keeps no
    model and the checkpoint's files hold every float32 master (its share is read from them, and the engine gets the
    centre from the owners of the shares): each process would hold a copy of the model until it is released."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    return keeps_model(trainer) or not holds_every_master(checkpoint, evolving_parameters(model))


def load_fixed_weights(model, checkpoint: str) -> None:
    """Load into `model` the checkpoint's weights of its parameters and buffers that do not evolve, one at a time
    (the population reads the evolving ones from the checkpoint's files)."""
    evolving, files = evolving_parameters(model), TensorFiles(model_weight_files(checkpoint))
    with torch.no_grad():
        for name, tensor in model.state_dict().items():  # the model's own tensors (detached views)
            if name not in evolving and name in files:
                tensor.copy_(files[name])


def restore_model_weights(trainer) -> None:
    """Give the model's weights back to the processes of tensor-parallel engines that released them, from the main
    process (which saves, so it keeps the model holding the centre): before anything that reads or loads them
    (another population, the Trainer's load of a checkpoint, coverage's entropies). Collective where the run's
    engines are tensor-parallel; nothing is sent when no process released its model."""
    if engine_group_size(trainer.args) == 1:
        return
    model = trainer.accelerator.unwrap_model(trainer.model)
    restore(evolving_parameters(model), source=0, device=trainer.args.device)


def update_shards(accelerator, args) -> UpdateShards | None:
    """How the processes share computing the update, or None to compute all of it on each."""
    processes = accelerator.num_processes
    # A tensor-parallel engine's processes split the master itself: each owner updates its own tensors.
    if processes == 1 or not args.shard_update or engine_group_size(args) > 1:
        return None
    return UpdateShards(accelerator.process_index, processes)
