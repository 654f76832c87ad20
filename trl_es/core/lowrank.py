"""Low-rank population members (EGGROLL, arXiv 2511.16652): the noise and the update of a low-rank population.

A low-rank member perturbs each weight matrix `W` (`out x in`) by `sign * sigma * A @ B.T / sqrt(rank)`, where
`A` (`out x rank`) and `B` (`in x rank`) are standard normal float32 factors, a pure function of (seed, parameter name,
shape, rank) like the full-rank noise of `noise.py`. Each entry of `A @ B.T / sqrt(rank)` has unit variance, so `sigma`
keeps its meaning.

Which parameters are low-rank: the 2-D weights whose every use is an `nn.Linear` or `nn.Embedding` weight (a tied
`lm_head`/`embed_tokens` matrix is both; both uses see the same factors). For such a matrix a member's output is the
base output plus a rank-`rank` correction computed from the input, so a population can be evaluated without writing
any weight (`backends/hf_lowrank.py`: forward hooks; `backends/vllm_lora.py`: LoRA adapters).

The other evolving parameters (norm weights, biases, any matrix with another use) follow `other_parameters`:
`"full"` gives them full-rank noise `parameter_noise(seed, name, shape)`, as for full-rank members; `"frozen"` keeps
them fixed: neither perturbed nor updated.

The update is the full-rank sum `sum_i coef_i * A_i @ B_i.T / sqrt(rank)` of each matrix, computed as one matmul
`[A_1 .. A_K] @ ([B_1 .. B_K] * coef).T`; `LowRankMasterWeights` keeps the `MasterWeights` interface, so the trainer,
checkpoints and the explicit (weight-writing) backends use it unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import torch
from torch import nn

from .master import MasterWeights
from .noise import Member, derive_seed, parameter_noise

OTHER_PARAMETERS = ("full", "frozen")


def lowrank_factors(
    seed: int, name: str, shape: torch.Size | tuple[int, ...], rank: int, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """The float32 factors `A` (`shape[0] x rank`) and `B` (`shape[1] x rank`) of one matrix of one member.

    Like `parameter_noise`, the values depend only on the arguments and the device type, never on what was drawn
    before; the rank is part of the seed, so two ranks give unrelated factors.
    """
    rows, columns = shape
    generator = torch.Generator(device=device).manual_seed(derive_seed(seed, name, "lowrank", rank, rows, columns))
    factors = torch.randn((rows + columns, rank), generator=generator, dtype=torch.float32, device=device)
    return factors[:rows], factors[rows:]


def lowrank_noise(
    seed: int, name: str, shape: torch.Size | tuple[int, ...], rank: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """The explicit perturbation direction `A @ B.T / sqrt(rank)` of one matrix (unit-variance entries)."""
    a, b = lowrank_factors(seed, name, shape, rank, device)
    return a @ b.T / math.sqrt(rank)


def _parameter_uses(model: nn.Module) -> dict[int, list[tuple[nn.Module, str]]]:
    """Every `(module, attribute)` that holds each parameter (tied parameters have several)."""
    uses: dict[int, list[tuple[nn.Module, str]]] = {}
    for module in model.modules():
        for attribute, param in module.named_parameters(recurse=False):
            uses.setdefault(id(param), []).append((module, attribute))
    return uses


def _is_lowrank_use(module: nn.Module, attribute: str) -> bool:
    if attribute != "weight":
        return False
    # `max_norm` renormalises looked-up rows, which no additive correction reproduces.
    return isinstance(module, nn.Linear) or (isinstance(module, nn.Embedding) and module.max_norm is None)


def lowrank_parameter_names(model: nn.Module, names: Sequence[str]) -> set[str]:
    """The names (among `names`, as in `model.named_parameters()`) of the 2-D parameters that get low-rank noise:
    those whose every use is an `nn.Linear` or `nn.Embedding` weight."""
    params = dict(model.named_parameters())
    uses = _parameter_uses(model)
    return {
        name
        for name in names
        if params[name].dim() == 2 and all(_is_lowrank_use(module, attr) for module, attr in uses[id(params[name])])
    }


class LowRankMasterWeights(MasterWeights):
    """A [`MasterWeights`] whose matrices get low-rank noise; same perturbation and update interface.

    Args:
        parameters (`dict[str, torch.Tensor]`):
            The evolving parameters by name, all kept in the float32 master (also the frozen ones, so checkpoints
            keep the same keys).
        sigma (`float`):
            Noise scale of the members (see [`MasterWeights`]).
        lowrank_names (`set[str]`):
            The names that get low-rank noise (see [`lowrank_parameter_names`]); each must be a 2-D parameter.
        rank (`int`):
            Rank of each member's perturbation of each matrix.
        other_parameters (`str`, *optional*, defaults to `"full"`):
            `"full"`: the other parameters get full-rank noise, as full-rank members do. `"frozen"`: they are neither
            perturbed nor updated (nor decayed).
        share_float32 (`bool`, *optional*, defaults to `False`):
            See [`MasterWeights`]: float32 parameters serve as their own master (the batched population never writes
            weights, so the model always holds the centre).
        device (`torch.device` or `str`, *optional*): As in [`MasterWeights`].
    """

    def __init__(
        self,
        parameters: dict[str, torch.Tensor],
        sigma: float,
        lowrank_names: set[str],
        rank: int,
        other_parameters: str = "full",
        share_float32: bool = False,
        device: torch.device | str | None = None,
    ):
        if not isinstance(rank, int) or rank < 1:
            raise ValueError(f"The low-rank perturbation needs an integer rank >= 1, got rank={rank!r}.")
        if other_parameters not in OTHER_PARAMETERS:
            raise ValueError(f"Unknown other_parameters={other_parameters!r}; use one of {OTHER_PARAMETERS}.")
        unknown = sorted(set(lowrank_names) - set(parameters))
        not_matrices = sorted(name for name in lowrank_names if name in parameters and parameters[name].dim() != 2)
        if unknown or not_matrices:
            raise ValueError(
                f"Low-rank names must be 2-D evolving parameters; unknown {unknown[:5]}, not 2-D {not_matrices[:5]}. "
                "Build them with `lowrank_parameter_names(model, parameters)`."
            )
        super().__init__(parameters, sigma, share_float32, device=device)
        self.lowrank_names = frozenset(lowrank_names)
        self.rank = rank
        self.other_parameters = other_parameters

    @classmethod
    def from_model(
        cls,
        model: nn.Module,
        parameters: dict[str, torch.Tensor],
        sigma: float,
        rank: int,
        other_parameters: str = "full",
        share_float32: bool = False,
        device: torch.device | str | None = None,
    ) -> LowRankMasterWeights:
        """The master of `parameters` (named as in `model.named_parameters()`), with the model's Linear and Embedding
        weights low-rank."""
        names = lowrank_parameter_names(model, list(parameters))
        return cls(parameters, sigma, names, rank, other_parameters, share_float32, device)

    def is_frozen(self, name: str) -> bool:
        return name not in self.lowrank_names and self.other_parameters == "frozen"

    def noise(self, seed: int, name: str) -> torch.Tensor | None:
        """The unit-scale noise `eps(seed)` of one tensor: low-rank, full-rank, or `None` when frozen."""
        master = self.tensors[name]
        if name in self.lowrank_names:
            return lowrank_noise(seed, name, master.shape, self.rank, master.device)
        if self.is_frozen(name):
            return None
        return parameter_noise(seed, name, master.shape, master.device)

    def perturbed(self, member: Member, dtype: torch.dtype = torch.float32) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield `(name, master + sign * sigma * eps)` one tensor at a time (float32, or cast to `dtype`); frozen
        tensors are copies of the master. Used to write a member's weights explicitly (tests, vLLM weight loading)."""
        for name, master in self.tensors.items():
            noise = self.noise(member.seed, name)
            value = master.clone() if noise is None else noise.mul_(member.sign * self.sigma).add_(master)
            yield name, value.to(dtype)

    def update_direction(self, name: str, coefficients: dict[int, float]) -> torch.Tensor:
        """`sum_seed coef * eps(seed)` for one tensor; for a low-rank matrix one matmul of the stacked factors."""
        master = self.tensors[name]
        if name not in self.lowrank_names:
            return torch.zeros_like(master) if self.is_frozen(name) else super().update_direction(name, coefficients)
        terms = [(seed, coef) for seed, coef in coefficients.items() if coef != 0.0]
        if not terms:
            return torch.zeros_like(master)
        a_blocks, b_blocks = [], []
        for seed, coef in terms:
            a, b = lowrank_factors(seed, name, master.shape, self.rank, master.device)
            a_blocks.append(a)
            b_blocks.append(b.mul_(coef / math.sqrt(self.rank)))
        return torch.cat(a_blocks, dim=1) @ torch.cat(b_blocks, dim=1).T
