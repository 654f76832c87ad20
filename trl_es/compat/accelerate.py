"""Every use of Accelerate's private API, in one place (tested in `tests/compat/test_accelerate.py`)."""

from __future__ import annotations

from collections.abc import Callable

from accelerate import Accelerator
from accelerate.state import AcceleratorState
from torch import nn

# The Accelerate privates used here, by function.
PRIVATE_NAMES = {
    "reset_accelerator_state": ["AcceleratorState._reset_state"],
    "prepare_without_ddp": ["Accelerator.prepare preparing a module through self.prepare_model (in _prepare_one)"],
}


def reset_accelerator_state() -> None:
    """Forget the process's Accelerate state, so that the next `Accelerator` (the next trainer in this process) is
    built from its own arguments: its DeepSpeed plugin, mixed precision and gradient accumulation. Accelerate keeps
    one shared state per process and otherwise hands every later `Accelerator` the first one's."""
    AcceleratorState._reset_state()


def prepare_without_ddp(accelerator: Accelerator, is_trained_model: Callable[[nn.Module], bool], place: bool) -> None:
    """From now on, `accelerator.prepare` and `accelerator.prepare_model` prepare a module for which
    `is_trained_model(module)` holds as for evaluation (Accelerate's `evaluation_mode`): mixed precision and
    compilation, but no `DistributedDataParallel`; and with `place=False` they leave it where it is.

    ES reduces no gradients, and DDP would cost every process a gradient buffer the size of the evolving parameters
    (its buckets are allocated when it wraps the model) and a broadcast of the whole model at the start. `Trainer`
    prepares its model inside `train` and `evaluate` with `accelerator.prepare(model, optimizer)`, which has no
    argument for either; `prepare` passes each module to `self.prepare_model`, which this replaces on the instance.
    Every other module is prepared as Accelerate would.
    """
    prepare_model = accelerator.prepare_model  # the bound method

    def prepare_model_for_es(module: nn.Module, device_placement: bool | None = None, evaluation_mode: bool = False):
        if is_trained_model(module):
            return prepare_model(module, device_placement=device_placement if place else False, evaluation_mode=True)
        return prepare_model(module, device_placement=device_placement, evaluation_mode=evaluation_mode)

    accelerator.prepare_model = prepare_model_for_es
