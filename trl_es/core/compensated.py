"""A master weight in 4 bytes that loses no update: a bfloat16 value and a bfloat16 residual (compensated summation).

A bfloat16 master alone keeps 8 significant bits: an ES step of `lr * direction` smaller than half a unit in the last
place of a weight rounds away, every step, and the run stops moving. Keeping the rounding error of each addition in a
second bfloat16 tensor (`low`) carries it into the next step, so small steps accumulate as they do in float32: the
pair holds about 16 significant bits, and each step's addition is exact to within the residual's own rounding (a
relative 2^-9 of the residual, which is itself at most half a unit of `high`). `split`, `join` and `add_` are the
arithmetic; `CompensatedMasterWeights` is the ES master stored that way (`ESConfig.master_dtype`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch

from .direction_optimizer import DirectionOptimizer
from .guards import check_step_fits
from .master import MasterWeights, master_device
from .noise import Member, parameter_noise
from .tensor_chunks import flat_slices, largest_magnitude


def split(value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(`high`, `low`): `value` rounded to bfloat16, and what that rounding left out, in bfloat16.

    The pair keeps one invariant: its float32 value cast to bfloat16 is `high`, so an engine that loads the float32
    values in bfloat16 holds exactly the `high` half (the model's weights). Rounding `low` can leave the pair on a tie
    between `high` and its neighbour, which a cast rounds to the neighbour (about 0.1% of elements after an update);
    there the neighbour becomes `high` and the exact rest (half a unit, a power of two) `low`: the same value.
    """
    value = value.float()
    high = value.to(torch.bfloat16)
    low = (value - high.float()).to(torch.bfloat16)
    joined = high.float() + low.float()
    cast = joined.to(torch.bfloat16)
    tie = cast != high
    if tie.any():
        high = torch.where(tie, cast, high)
        low = torch.where(tie, (joined - cast.float()).to(torch.bfloat16), low)
    return high, low


def join(high: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    """The float32 value the pair holds."""
    return high.float() + low.float()


def add_(high: torch.Tensor, low: torch.Tensor, step: torch.Tensor, decay: float = 1.0) -> None:
    """`pair <- pair * decay + step` in place: in float32, then split again, so nothing of `step` below `high`'s
    resolution is lost. A slice at a time (`tensor_chunks`): the same bits as over the whole pair."""
    for high_part, low_part, step_part in flat_slices(high, low, step):
        value = join(high_part, low_part)
        if decay != 1.0:
            value.mul_(decay)
        store(high_part, low_part, value.add_(step_part))


def store(high: torch.Tensor, low: torch.Tensor, value: torch.Tensor) -> None:
    """Write `value`'s `split` into the pair, a slice at a time."""
    for high_part, low_part, value_part in flat_slices(high, low, value):
        new_high, new_low = split(value_part)
        high_part.copy_(new_high)
        low_part.copy_(new_low)


def largest_magnitude_of(high: torch.Tensor, low: torch.Tensor) -> float:
    """`max |value|` of the pair, a slice at a time (NaN where a value is NaN, as `largest_magnitude`)."""
    magnitudes = [largest_magnitude(join(*parts)) for parts in flat_slices(high, low)]
    return float(torch.tensor(magnitudes or [0.0]).max())  # Python's max would pass over a NaN after the first


class JoinedTensors(Mapping):
    """The float32 values of named pairs, computed when read (one tensor at a time): a read-only view with the
    interface of the float32 master's `tensors` dict."""

    def __init__(self, pairs: dict[str, tuple[torch.Tensor, torch.Tensor]]):
        self.pairs = pairs

    def __getitem__(self, name: str) -> torch.Tensor:
        return join(*self.pairs[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self.pairs)

    def __len__(self) -> int:
        return len(self.pairs)


class CompensatedMasterWeights(MasterWeights):
    """[`MasterWeights`] stored as bfloat16 pairs, with every update kept (see the module). Reading `tensors[name]`
    gives the float32 value the pair holds; the perturbation, update and checkpoint rules are the float32 master's,
    applied to those values.

    Args:
        parameters (`dict[str, torch.Tensor]`): The evolving parameters by name; their values are copied, or shared.
        sigma (`float`): Noise scale of the members.
        share_bfloat16 (`bool`, *optional*, defaults to `False`):
            Use bfloat16 parameters themselves as the `high` half of their pair, so that the master adds only the
            residual (2 bytes per parameter, where a float32 master adds 4) and updates land in them directly. Only
            valid when the parameters always hold the centre (members are generated elsewhere, as in vLLM).
        device (`torch.device` or `str`, *optional*): As in [`MasterWeights`].
    """

    def __init__(
        self,
        parameters: dict[str, torch.Tensor],
        sigma: float,
        share_bfloat16: bool = False,
        device: torch.device | str | None = None,
    ):
        self.sigma = sigma
        self.optimizer = DirectionOptimizer()
        self.device = master_device(parameters, device)
        self.pairs = {
            name: (param.detach(), torch.zeros_like(param.detach()))  # a bfloat16 value is its own pair
            if share_bfloat16 and param.dtype == torch.bfloat16 and param.device == self.device
            else split(param.detach().to(self.device))
            for name, param in parameters.items()
        }
        self.shared = {
            name for name, param in parameters.items() if self.pairs[name][0].data_ptr() == param.data_ptr()
        }
        self.tensors = JoinedTensors(self.pairs)
        self.shapes = {name: param.shape for name, param in parameters.items()}
        self.parameter_dtypes = {name: param.dtype for name, param in parameters.items()}

    def nbytes(self) -> int:
        """The bytes the master adds to the parameters: both halves of each pair, or the residual alone where the
        parameter is the `high` half."""
        return sum(
            low.nbytes + (0 if name in self.shared else high.nbytes) for name, (high, low) in self.pairs.items()
        )

    def holds(self, name: str, parameter: torch.Tensor) -> bool:
        return name in self.shared and self.pairs[name][0].data_ptr() == parameter.data_ptr()

    def perturbed_tensor(self, name: str, member: Member) -> torch.Tensor:
        """As [`MasterWeights.perturbed_tensor`], adding the pair's value a slice at a time: no float32 copy of the
        whole master tensor beside the noise."""
        high, low = self.pairs[name]
        noise = parameter_noise(member.seed, name, high.shape, high.device).mul_(member.sign * self.sigma)
        for noise_part, high_part, low_part in flat_slices(noise, high, low):
            noise_part.add_(join(high_part, low_part))
        return noise

    def centre(self, dtype: torch.dtype = torch.float32) -> Iterator[tuple[str, torch.Tensor]]:
        """As [`MasterWeights.centre`]; in bfloat16 the centre is each pair's `high` half itself (`split` keeps the
        pair's value cast to bfloat16 equal to it), with no float32 copy made."""
        for name, (high, low) in self.pairs.items():
            yield name, high if dtype == torch.bfloat16 else join(high, low).to(dtype)

    def _add_step(self, name: str, step: torch.Tensor, decay: float, lr: float) -> None:
        high, low = self.pairs[name]
        check_step_fits(name, largest_magnitude_of(high, low), step, decay, lr, self.parameter_dtypes[name])
        add_(high, low, step, decay)

    def _written(self, name: str, value: torch.Tensor) -> None:
        """`value` (the float32 value read from the pair, then updated or overwritten) goes back into the pair."""
        store(*self.pairs[name], value)
