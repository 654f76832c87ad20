"""The population an ESTrainer evolves, built from its model when the run first needs it: the model's evolving weights
checked, a model kept in host memory moved there, the master, the model's weights released where a process keeps none
(`released_model.py`), and the backend (`build_population`); then the processes' masters are compared before the first
member is drawn."""

from __future__ import annotations

import torch

from ..backends.population import Population, build_population, evolving_parameters
from ..compat.trl import colocated_engine, colocated_engine_group
from ..core.distributed import check_ranks_agree
from ..core.guards import check_finite_tensors
from ..core.update_shards import UpdateShards
from .config_checks import splits_master
from .released_model import keeps_model, restore_model_weights


def build_trainer_population(trainer, resumed=None) -> Population:
    """`trainer`'s population, from its model's current weights (and `resumed`'s float32 masters and `es_optimizer`
    state: `resume.ResumedRun`)."""
    args = trainer.args
    model = trainer.accelerator.unwrap_model(trainer.model)
    # The model a process released with an earlier population: not where the checkpoint the run resumes from gives
    # every master (after `load_best_model_at_end`, or a resume), which the population reads instead.
    reads_masters = resumed is not None and all(name in resumed.lossy_masters for name in evolving_parameters(model))
    restore_model_weights(trainer, wanted=not reads_masters)
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
        master_group=master_group(trainer),
        device=args.device if args.model_in_host_memory else None,  # else the model's
        # The engines get every member from the master (a server from seeds), and checkpoints are written by the
        # processes that save: the model here would be one more copy of it per process, in host memory.
        keep_model=keep_model,
    )
    # No DDP broadcast evens them; a resume's processes must have read the same checkpoint
    check_ranks_agree(trainer.accelerator, population.master, step=0, resumed_from=resumed and resumed.checkpoint)
    return population


def master_group(trainer):
    """The processes that split the master between them ([`splits_master`]), or None where each holds all of it."""
    if not splits_master(trainer.args):
        return None
    return colocated_engine_group(trainer) or torch.distributed.group.WORLD  # a server run's: every process


def update_shards(accelerator, args) -> UpdateShards | None:
    """How the processes share computing the update, or None to compute all of it on each."""
    processes = accelerator.num_processes
    # Processes that split the master itself share the update already: each owner updates its own tensors.
    if processes == 1 or not args.shard_update or splits_master(args):
        return None
    return UpdateShards(accelerator.process_index, processes)
