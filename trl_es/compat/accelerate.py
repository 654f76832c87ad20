"""Every use of Accelerate's private API, in one place (tested in `tests/compat/test_accelerate.py`)."""

from __future__ import annotations

from accelerate.state import AcceleratorState

# The Accelerate privates used here, by function.
PRIVATE_NAMES = {"reset_accelerator_state": ["AcceleratorState._reset_state"]}


def reset_accelerator_state() -> None:
    """Forget the process's Accelerate state, so that the next `Accelerator` (the next trainer in this process) is
    built from its own arguments: its DeepSpeed plugin, mixed precision and gradient accumulation. Accelerate keeps
    one shared state per process and otherwise hands every later `Accelerator` the first one's."""
    AcceleratorState._reset_state()
