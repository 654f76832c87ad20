"""The trainer's model on the processes that save no checkpoint, where vLLM engines evaluate the members from the
master alone: colocated engines (one per process, or one shared by a tensor-parallel group) or `trl-es vllm-serve`
servers (issue 29).

Those processes need none of it: a colocated engine gets every member and the centre from the master (from the owners
of its shares, with tensor parallelism), a server regenerates them itself, and checkpoints are written by the
processes that save. So they release the model's evolving weights as soon as their master holds them, while the
population is built (`core/released_weights.py`), neither a resume nor `load_best_model_at_end` loads a checkpoint's
weights into their model, and the weights come back from the main process before anything that reads or loads them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..backends.population import evolving_parameters
from ..core.checkpoint import model_weight_files
from ..core.released_weights import restore
from ..core.tensor_files import TensorFiles
from .resume import holds_every_master


def releases_model(args) -> bool:
    """Whether the processes that save no checkpoint let go of the model's weights: where vLLM engines evaluate the
    members from a full-rank float32 master, with several processes. The same on every process. A low-rank master
    and the compensated one hold (part of) the model as their own, so releasing it would save nothing; servers take
    neither."""
    engines_evaluate = args.use_vllm and args.perturbation == "full" and args.master_dtype == "float32"
    return engines_evaluate and args.world_size > 1


def keeps_model(trainer) -> bool:
    """Whether this process keeps the model's weights while it trains."""
    return not releases_model(trainer.args) or trainer.args.should_save


def loads_checkpoint_weights(trainer, checkpoint: str) -> bool:
    """Whether a resume from `checkpoint` (or `load_best_model_at_end`, from the best one) loads its weights into this
    process's model, as the Trainer does: not in a process that keeps no model when the checkpoint's files hold every
    float32 master, as its population then reads its share from them (loaded, the weights would be a private copy of
    the model, held until they are released)."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    return keeps_model(trainer) or not holds_every_master(checkpoint, evolving_parameters(model))


def load_checkpoint_into_model(trainer, checkpoint: str, trainer_load: Callable[[], None], model=None) -> None:
    """Load `checkpoint`'s weights into the model (a resume's, or `load_best_model_at_end`'s best one) with
    `trainer_load` (the Trainer's own load) where [`loads_checkpoint_weights`]; elsewhere only the weights that do not
    evolve. Where every process loads them, those that released the weights get them back first (collective; the
    checkpoint's files decide it the same on every process)."""
    model = trainer.accelerator.unwrap_model(model or trainer.model)
    if not loads_checkpoint_weights(trainer, checkpoint):
        load_fixed_weights(model, checkpoint)
        return
    if releases_model(trainer.args) and not holds_every_master(checkpoint, evolving_parameters(model)):
        restore_model_weights(trainer)
    trainer_load()


def load_fixed_weights(model, checkpoint: str) -> None:
    """Load into `model` the checkpoint's weights of its parameters and buffers that do not evolve, one at a time
    (the population reads the evolving ones from the checkpoint's files)."""
    evolving, files = evolving_parameters(model), TensorFiles(model_weight_files(checkpoint))
    with torch.no_grad():
        for name, tensor in model.state_dict().items():  # the model's own tensors (detached views)
            if name not in evolving and name in files:
                tensor.copy_(files[name])


def restore_model_weights(trainer, wanted: bool = True) -> None:
    """Give the model's weights back to the processes that released them, from the main process (which saves, so it
    keeps the model holding the centre): before anything that reads or loads them (another population, the Trainer's
    load of a checkpoint). Collective where processes release their model (`releases_model`); nothing is sent when
    no process released it, or none that did wants it (`wanted=False`: a population that reads every master from a
    checkpoint)."""
    if not releases_model(trainer.args):
        return
    model = trainer.accelerator.unwrap_model(trainer.model)
    restore(evolving_parameters(model), source=0, device=trainer.args.device, wanted=wanted)
