"""Seeded population noise: every perturbation is a pure function of (seed, parameter name, shape).

Nothing is stored. A member is a seed and a sign; any process that knows them regenerates the same noise, which is why
ranks (and, later, inference servers) exchange seeds and scalars instead of weights.

The parameter name is mixed into the generator seed. The anchor code (Qiu et al., arXiv 2509.24372) re-seeds one
generator per tensor with the member seed, so every tensor of the same shape receives the same noise; hashing the name
makes the noise of different tensors independent.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch


def derive_seed(*parts: int | str) -> int:
    """A 63-bit seed from `parts`, stable across processes and Python runs (unlike `hash`)."""
    digest = hashlib.blake2b(":".join(str(part) for part in parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def parameter_noise(
    seed: int, name: str, shape: torch.Size | tuple[int, ...], device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Standard normal float32 noise for one parameter tensor of one member.

    The values depend only on `seed`, `name`, `shape` and the device type (CPU and CUDA generators use different
    algorithms); they do not depend on the process, the rank or what was generated before.
    """
    shape = tuple(shape)
    generator = torch.Generator(device=device).manual_seed(derive_seed(seed, name, *shape))
    return torch.randn(shape, generator=generator, dtype=torch.float32, device=device)


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
