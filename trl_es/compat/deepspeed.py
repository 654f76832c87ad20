"""Every use of DeepSpeed's private API, in one place (tested in `tests/compat/test_deepspeed.py`)."""

from __future__ import annotations

import inspect
import sys

import torch

# The DeepSpeed privates used here, by function.
PRIVATE_NAMES = {
    "release_process_groups": [
        "deepspeed.comm.torch.TorchBackend.barrier and .monitored_barrier (their `group` default argument)",
        "deepspeed.utils.groups._release_process_group_references",
    ],
}


def release_process_groups() -> None:
    """Drop DeepSpeed's references to torch.distributed process groups, so that `destroy_process_group` frees them.

    DeepSpeed holds the world group in two places beyond `destroy_process_group`'s reach:
    - `TorchBackend.barrier` and `monitored_barrier` take `group=torch.distributed.GroupMember.WORLD` as a default
      argument, which Python evaluates once, when `deepspeed.comm.torch` is imported. The `Trainer` imports it while
      it is built, after Accelerate initialized the process group, so the defaults hold the world group for the rest
      of the process. They become `None` again, which both methods read as the world group when they are called.
    - A DeepSpeed engine clones the world group into `deepspeed.utils.groups`, and only DeepSpeed's own
      `destroy_process_group` lets go of it (Accelerate calls torch's). DeepSpeed clones it again when it needs it.

    A group still held when the interpreter exits keeps its gloo threads running, and a process that trained and
    saved can abort there ("terminate called without an active exception"). Call this where no DeepSpeed engine
    runs. Nothing is imported: where DeepSpeed's modules are not loaded, they hold nothing.
    """
    backend = sys.modules.get("deepspeed.comm.torch")
    if backend is not None:
        for method in (backend.TorchBackend.barrier, backend.TorchBackend.monitored_barrier):
            function = inspect.unwrap(method)  # under DeepSpeed's decorators
            function.__defaults__ = tuple(
                None if isinstance(value, torch.distributed.ProcessGroup) else value
                for value in function.__defaults__ or ()
            )
    groups = sys.modules.get("deepspeed.utils.groups")
    if groups is not None:
        groups._release_process_group_references(None)
