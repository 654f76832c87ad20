"""The ES master kept in host memory (`ESConfig.offload_master`): the accelerator holds one tensor of it at a time.

Every value is still computed on the accelerator, from a copy of the host tensor: the noise (whose values depend on
the device type), each member's tensor and each update are those of a master kept on the accelerator, bitwise. The
cost is moving the master across the host link: 4 bytes per parameter to the accelerator for each member, and each
update's tensors both ways (docs/distributed.md has the measured cost). Where the accelerator is the CPU, offloading
saves nothing and adds the copies; it runs the same code, which is how the tests check it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch

from .released_weights import full_shape, is_released


def host_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A float32 copy of `tensor` in host memory: page-locked where an accelerator is present, so that copies to it
    run at the link's speed and can overlap the work already queued there."""
    if is_released(tensor):  # no values to copy (see `float32_copy`)
        value = torch.empty(full_shape(tensor), dtype=torch.float32)
    else:
        value = tensor.detach().to("cpu", torch.float32, copy=True)
    return value.pin_memory() if torch.cuda.is_available() else value


class HostTensors(Mapping):
    """Named host tensors read onto `device` (one copy per read): the interface of the float32 master's `tensors`
    dict. `host` holds the values; write a changed copy back with `store`."""

    def __init__(self, host: dict[str, torch.Tensor], device: torch.device):
        self.host = host
        self.device = device

    def __getitem__(self, name: str) -> torch.Tensor:
        # Always a copy, also where the accelerator is the CPU: a change must be stored to last, on every machine.
        return self.host[name].to(self.device, non_blocking=True, copy=True)

    def __iter__(self) -> Iterator[str]:
        return iter(self.host)

    def __len__(self) -> int:
        return len(self.host)

    def store(self, name: str, value: torch.Tensor) -> None:
        """Write `value` (read with `self[name]`, then changed) back into the host tensor; waits for the copy, so
        `value` may be freed or reused at once."""
        self.host[name].copy_(value)
