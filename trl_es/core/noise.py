"""Seeded population noise: every perturbation is a pure function of (seed, parameter name, shape).

Nothing is stored. A member is a seed and a sign; any process that knows them regenerates the same noise, which is why
ranks (and, later, inference servers) exchange seeds and scalars instead of weights.

The parameter name is mixed into the generator seed. The anchor code (Qiu et al., arXiv 2509.24372) re-seeds one
generator per tensor with the member seed, so every tensor of the same shape receives the same noise; hashing the name
makes the noise of different tensors independent.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import torch


def derive_seed(*parts: int | str) -> int:
    """A 63-bit seed from `parts`, stable across processes and Python runs (unlike `hash`)."""
    digest = hashlib.blake2b(":".join(str(part) for part in parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def parameter_noise(
    seed: int,
    name: str,
    shape: torch.Size | tuple[int, ...],
    device: torch.device | str = "cpu",
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Standard normal float32 noise for one parameter tensor of one member.

    The values depend only on `seed`, `name`, `shape` and the device type (CPU and CUDA generators use different
    algorithms); they do not depend on the process, the rank or what was generated before. With `out` (a contiguous
    float32 tensor of that shape on that device), the same values are written into it and it is returned.
    """
    shape = tuple(shape)
    generator = torch.Generator(device=device).manual_seed(derive_seed(seed, name, *shape))
    if out is None:
        return torch.randn(shape, generator=generator, dtype=torch.float32, device=device)
    return out.normal_(generator=generator)  # `randn` is `empty` then `normal_`: the same values (tested)


class NoiseBuffer:
    """Scratch memory for drawing noise one tensor at a time: `draw` writes `parameter_noise(seed, name, shape)` into a
    view of one float32 buffer per device, grown to the largest tensor drawn, so a pass over the model does not
    allocate (and, on CPU, page-fault) a new tensor per parameter and draw. A view is valid until the next `draw`;
    the buffer lives as long as this object, so keep one for one pass, not for the run.
    """

    def __init__(self):
        self._buffers: dict[torch.device, torch.Tensor] = {}

    def draw(
        self, seed: int, name: str, shape: torch.Size | tuple[int, ...], device: torch.device | str = "cpu"
    ) -> torch.Tensor:
        device, numel = torch.device(device), math.prod(shape)
        buffer = self._buffers.get(device)
        if buffer is None or buffer.numel() < numel:
            buffer = self._buffers[device] = torch.empty(numel, dtype=torch.float32, device=device)
        return parameter_noise(seed, name, shape, device, out=buffer[:numel].view(tuple(shape)))


@dataclass(frozen=True)
class Member:
    """One member of a population: its weights are `master + sign * sigma * noise(seed)`."""

    seed: int
    sign: int = 1


def population(base_seed: int, step: int, population_size: int, antithetic: bool = False) -> list[Member]:
    """The members evaluated at ES step `step`, in the fixed order used to accumulate the update.

    With `antithetic=True`, members come in mirrored pairs `(+eps, -eps)` that share a seed.
    """
    if antithetic:
        if population_size % 2:
            raise ValueError(f"An antithetic population needs an even size, got population_size={population_size}.")
        seeds = [derive_seed(base_seed, step, pair) for pair in range(population_size // 2)]
        return [Member(seed, sign) for seed in seeds for sign in (1, -1)]
    return [Member(derive_seed(base_seed, step, index)) for index in range(population_size)]


def sampling_seed(base_seed: int, step: int) -> int:
    """The sampling seed shared by every member of step `step` (common random numbers)."""
    return derive_seed(base_seed, step, "sampling") % (2**31)
