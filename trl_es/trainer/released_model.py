"""The trainer's model on the processes of a tensor-parallel colocated engine that save no checkpoint (issue 29).

Those processes need none of it: each keeps its share of the float32 master, the engine gets every member and the
centre from the owners of the shares, and checkpoints are written by the processes that save. So they release the
model's evolving weights once the population is built (`core/released_weights.py`), neither a resume nor
`load_best_model_at_end` loads a checkpoint's weights into their model, and the weights come back from the main process
before anything that reads or loads them.
"""

from __future__ import annotations

import torch

from ..backends.population import evolving_parameters
from ..compat.trl import colocated_engine_group
from ..core.checkpoint import model_weight_files
from ..core.released_weights import restore
from ..core.tensor_files import TensorFiles
from .config_checks import engine_group_size
from .resume import holds_every_master


def keeps_model(trainer) -> bool:
    """Whether this process keeps the model's weights while it trains: a process of a tensor-parallel engine that
    saves no checkpoint lets go of them."""
    return colocated_engine_group(trainer) is None or trainer.args.should_save


def loads_checkpoint_weights(trainer, checkpoint: str) -> bool:
    """Whether a resume from `checkpoint` (or `load_best_model_at_end`, from the best one) loads its weights into this
    process's model, as the Trainer does: not in a process that keeps no model when the checkpoint's files hold every
    float32 master, as its population then reads its share from them (loaded, the weights would be a private copy of
    the model, held until they are released)."""
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


def restore_model_weights(trainer, wanted: bool = True) -> None:
    """Give the model's weights back to the processes of tensor-parallel engines that released them, from the main
    process (which saves, so it keeps the model holding the centre): before anything that reads or loads them
    (another population, the Trainer's load of a checkpoint). Collective where the run's engines are tensor-parallel;
    nothing is sent when no process released its model, or none that did wants it (`wanted=False`: a population
    that reads every master from a checkpoint)."""
    if engine_group_size(trainer.args) == 1:
        return
    model = trainer.accelerator.unwrap_model(trainer.model)
    restore(evolving_parameters(model), source=0, device=trainer.args.device, wanted=wanted)
