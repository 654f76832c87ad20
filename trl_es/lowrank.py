"""Low-rank population members (EGGROLL, arXiv 2511.16652): the whole population in one batched `generate` call.

A low-rank member perturbs each weight matrix `W` (`out x in`) by `sign * sigma * A @ B.T / sqrt(rank)`, where
`A` (`out x rank`) and `B` (`in x rank`) are standard normal float32 factors, a pure function of (seed, parameter name,
shape, rank) like the full-rank noise of `noise.py`. Each entry of `A @ B.T / sqrt(rank)` has unit variance, so `sigma`
keeps its meaning.

Which parameters are low-rank: the 2-D weights whose every use is an `nn.Linear` or `nn.Embedding` weight (a tied
`lm_head`/`embed_tokens` matrix is both; both uses see the same factors). For such a matrix the member's output is the
base output plus a rank-`rank` correction computed from the input, so the population is evaluated without writing any
weight:

- `nn.Linear`: `y_i = x_i W.T + b + s_i sigma / sqrt(r) * (x_i B_i) A_i.T`, for the rows `x_i` of member `i`;
- `nn.Embedding`: `e_i = W[ids_i] + s_i sigma / sqrt(r) * A_i[ids_i] B_i.T`.

Forward hooks add these terms. The batch is member-major: member `i` owns rows `i * rows_per_member` to
`(i + 1) * rows_per_member - 1`, in the prefill and in every decoding step (generate keeps the row order; the KV cache
holds each row's own perturbed keys and values), so the hooks need no per-row bookkeeping: the rows are viewed as
`(members, rows_per_member * seq, in)` and two batched matmuls cost O(rows * seq * rank * (in + out)).

The other evolving parameters (norm weights, biases, any matrix with another use) follow `other_parameters`:

- `"full"`: full-rank noise `parameter_noise(seed, name, shape)`, as for full-rank members. In the batched forward a
  `nn.Linear` bias adds its member's noise to the output (exact: the output is affine in the bias). Any other module
  (RMSNorm, LayerNorm, ...) is re-run once per member with its perturbed parameters, vectorised with `torch.func.vmap`.
  Re-running is exact whatever the module computes (RMSNorm's `w * x`, Gemma's `(1 + w) * x`, LayerNorm's affine),
  where rescaling the output by `(w + delta) / w` would not be (it divides by weights near zero). It needs a leaf
  module called with one tensor; anything else raises `NotImplementedError` naming the module.
- `"frozen"`: neither perturbed nor updated; the update and the hooks touch only the low-rank matrices.

Sampling: one `generate` call draws different random numbers for every row, which breaks the common random numbers
of a step (member `i`'s `j`-th row must sample like every other member's `j`-th row); `CommonRandomGumbel` restores
them. In float32 a member's outputs match explicitly written weights to rounding; in bf16 the hook adds its term to
the bf16 base output instead of rounding `W + delta` to bf16, so they are close, not bitwise equal.

The update is the full-rank sum `sum_i coef_i * A_i @ B_i.T / sqrt(rank)` of each matrix, computed as one matmul
`[A_1 .. A_K] @ ([B_1 .. B_K] * coef).T`; `LowRankMasterWeights` keeps the `MasterWeights` interface, so the trainer,
checkpoints and the explicit (weight-writing) backends use it unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import nn
from transformers import LogitsProcessor, LogitsProcessorList
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

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
    """

    def __init__(
        self,
        parameters: dict[str, torch.Tensor],
        lowrank_names: set[str],
        rank: int,
        other_parameters: str = "full",
        share_float32: bool = False,
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
        super().__init__(parameters, share_float32)
        self.lowrank_names = frozenset(lowrank_names)
        self.rank = rank
        self.other_parameters = other_parameters

    @classmethod
    def from_model(
        cls,
        model: nn.Module,
        parameters: dict[str, torch.Tensor],
        rank: int,
        other_parameters: str = "full",
        share_float32: bool = False,
    ) -> LowRankMasterWeights:
        """The master of `parameters` (named as in `model.named_parameters()`), with the model's Linear and Embedding
        weights low-rank."""
        names = lowrank_parameter_names(model, list(parameters))
        return cls(parameters, names, rank, other_parameters, share_float32)

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

    def perturbed(self, member: Member, sigma: float) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield `(name, master + sign * sigma * eps)` one tensor at a time (float32); frozen tensors are copies of the
        master. Used to write a member's weights explicitly (tests, vLLM weight loading)."""
        for name, master in self.tensors.items():
            noise = self.noise(member.seed, name)
            yield name, master.clone() if noise is None else noise.mul_(member.sign * sigma).add_(master)

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


# ---------------------------------------------------------------------------------------------------------------------
# Batched evaluation: forward hooks that give each member's rows its own perturbation.


def _member_factors(
    master: LowRankMasterWeights, name: str, members: Sequence[Member], sigma: float, like: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stacked factors of one matrix for the population, on `like`'s device and dtype: `A` (`N x out x r`) and `B`
    scaled by `sign * sigma / sqrt(r)` (`N x in x r`). A seed shared by an antithetic pair is drawn once."""
    shape, device = master.tensors[name].shape, master.tensors[name].device
    drawn = {
        seed: lowrank_factors(seed, name, shape, master.rank, device)
        for seed in dict.fromkeys(m.seed for m in members)
    }
    a = torch.stack([drawn[m.seed][0] for m in members])
    b = torch.stack([drawn[m.seed][1] * (m.sign * sigma / math.sqrt(master.rank)) for m in members])
    return a.to(like.device, like.dtype), b.to(like.device, like.dtype)


def _member_values(
    master: LowRankMasterWeights, name: str, members: Sequence[Member], sigma: float, like: torch.Tensor
) -> torch.Tensor:
    """`cast(master + sign * sigma * eps)` of one full-rank tensor for each member (`N x *shape`): the values the
    explicit path writes."""
    tensor = master.tensors[name]
    stacked = torch.stack(
        [parameter_noise(m.seed, name, tensor.shape, tensor.device).mul_(m.sign * sigma).add_(tensor) for m in members]
    )
    return stacked.to(like.device, like.dtype)


class _MemberHook:
    """Forward hook of one module: gives the rows of each member that member's perturbation.

    `lowrank` holds the stacked factors of the module's weight, `bias_noise` the scaled noise of a Linear bias
    (`N x out`), `full` the per-member values of the other parameters, for which the module is re-run per member.
    """

    def __init__(self, population_size: int, rows_per_member: int, lowrank=None, bias_noise=None, full=None):
        self.population_size = population_size
        self.rows_per_member = rows_per_member
        self.lowrank = lowrank
        self.bias_noise = bias_noise
        self.full = full or {}
        self.rerunning = False  # the per-member re-run calls the module again: its hook must let that call through

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict, output: torch.Tensor) -> torch.Tensor | None:
        if self.rerunning:
            return None
        inputs = args[0] if args else next(iter(kwargs.values()))
        members = self.population_size
        if inputs.shape[0] != members * self.rows_per_member:
            raise ValueError(
                f"The low-rank population expects {members} members x {self.rows_per_member} rows per member = "
                f"{members * self.rows_per_member} rows, but {type(module).__name__} got {inputs.shape[0]}. "
                "Generate the whole population in one padded call, member-major (member i owns rows "
                "i * rows_per_member .. (i + 1) * rows_per_member - 1), with rows_per_member = prompts per member x "
                "num_return_sequences; continuous batching (`generate_batch`) is not supported."
            )
        self._follow_model(module, output)
        if self.full:
            return self._rerun_per_member(module, args, kwargs, inputs, members, output)
        result = output.reshape(members, -1, output.shape[-1])
        if self.lowrank is not None:
            a, b = self.lowrank
            if isinstance(module, nn.Embedding):
                ids = inputs.reshape(members, -1) + torch.arange(members, device=inputs.device)[:, None] * a.shape[1]
                result = result + torch.bmm(a.reshape(-1, a.shape[-1])[ids], b.transpose(1, 2))
            else:
                low = torch.bmm(inputs.reshape(members, -1, inputs.shape[-1]), b)  # (N, rows * seq, r)
                result = result + torch.bmm(low, a.transpose(1, 2))
        if self.bias_noise is not None:
            result = result + self.bias_noise[:, None, :]
        return result.reshape(output.shape)

    def _follow_model(self, module: nn.Module, output: torch.Tensor) -> None:
        """Move the cached tensors to the output's (or the parameter's) device and dtype: TRL may cast the model to
        bf16 after the context was entered. `.to` returns the tensor itself when nothing changes."""
        if self.lowrank is not None:
            self.lowrank = tuple(factor.to(output.device, output.dtype) for factor in self.lowrank)
        if self.bias_noise is not None:
            self.bias_noise = self.bias_noise.to(output.device, output.dtype)
        for attribute, values in self.full.items():
            param = getattr(module, attribute)
            self.full[attribute] = values.to(param.device, param.dtype)

    def _rerun_per_member(self, module, args, kwargs, inputs, members, output):
        if len(args) != 1 or kwargs or not isinstance(output, torch.Tensor):
            raise NotImplementedError(
                f"other_parameters='full' re-runs {type(module).__name__} once per member, which needs a module "
                "called with one tensor and returning one. Use other_parameters='frozen', freeze its parameters "
                "(requires_grad=False), or evaluate members one at a time with explicit weights."
            )

        def forward(params, rows):
            return torch.func.functional_call(module, params, (rows,))

        self.rerunning = True
        try:
            outputs = torch.func.vmap(forward)(self.full, inputs.reshape(members, -1, *inputs.shape[1:]))
        finally:
            self.rerunning = False
        return outputs.reshape(output.shape)


def _population_hooks(
    model: nn.Module, master: LowRankMasterWeights, members: Sequence[Member], sigma: float, rows_per_member: int
) -> list[tuple[nn.Module, _MemberHook]]:
    names = {id(param): name for name, param in model.named_parameters() if name in master.tensors}
    missing = sorted(set(master.tensors) - set(names.values()))
    if missing:
        raise ValueError(
            f"The master holds parameters that the model does not: {missing[:5]}. Pass the model whose parameters "
            "built the master."
        )
    factors: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # a tied matrix is drawn once for all its uses
    hooks = []
    for module in model.modules():
        lowrank, full = None, {}
        for attribute, param in module.named_parameters(recurse=False):
            name = names.get(id(param))
            if name is None or master.is_frozen(name):
                continue
            if name in master.lowrank_names:
                if name not in factors:
                    factors[name] = _member_factors(master, name, members, sigma, param)
                lowrank = factors[name]
            else:
                full[attribute] = _member_values(master, name, members, sigma, param)
        bias_noise = None
        if isinstance(module, nn.Linear) and set(full) == {"bias"}:
            # The output is affine in the bias: adding each member's noise is exact, no re-run needed.
            bias_noise = full.pop("bias") - module.bias.detach()
        if full and (lowrank is not None or bias_noise is not None or next(module.children(), None) is not None):
            raise NotImplementedError(
                f"other_parameters='full' cannot perturb the parameters {sorted(full)} of {type(module).__name__} per "
                "member in one batch: only leaf modules are re-run per member. Use other_parameters='frozen', freeze "
                "them (requires_grad=False), or evaluate members one at a time with explicit weights."
            )
        if lowrank is not None or bias_noise is not None or full:
            hooks.append((module, _MemberHook(len(members), rows_per_member, lowrank, bias_noise, full)))
    return hooks


@contextmanager
def lowrank_population(
    model: nn.Module, master: LowRankMasterWeights, members: Sequence[Member], sigma: float, rows_per_member: int
) -> Iterator[None]:
    """Within this context, `model` evaluates the whole population at once: batch row `j` belongs to member
    `members[j // rows_per_member]`, whose perturbation it gets through forward hooks.

    The model's weights are never written, so nothing is restored: leaving the context (also through an exception)
    removes the hooks. The factors are drawn once, on the master's device (so they match the update), and cached on the
    model's device and dtype. The model's parameters must equal the master's (cast), i.e. the centre is loaded.

    Args:
        model (`nn.Module`):
            The model whose `named_parameters()` names built `master`.
        master ([`LowRankMasterWeights`]):
            The float32 master: which matrices are low-rank, the rank, and what happens to the other parameters.
        members (`Sequence[Member]`):
            The members in batch order.
        sigma (`float`):
            Noise scale.
        rows_per_member (`int`):
            Rows of each member in every forward: prompts per member x `num_return_sequences` (x `num_beams`). Every
            forward must have exactly `len(members) * rows_per_member` rows.

    Example:

    ```python
    batch = tokenizer(prompts * len(members), return_tensors="pt", padding=True)  # member-major, left-padded
    with lowrank_population(model, master, members, sigma, rows_per_member=len(prompts)):
        ids = model.generate(**batch, do_sample=False, max_new_tokens=64)
    completions_of_member_i = ids[i * len(prompts) : (i + 1) * len(prompts)]
    ```
    """
    if rows_per_member < 1:
        raise ValueError(f"rows_per_member must be >= 1, got {rows_per_member}.")
    handles = []
    try:
        for module, hook in _population_hooks(model, master, members, sigma, rows_per_member):
            handles.append(module.register_forward_hook(hook, with_kwargs=True))
        yield
    finally:
        for handle in handles:
            handle.remove()


class CommonRandomGumbel(LogitsProcessor):
    """Sampling with common random numbers across the members of one batched population (Gumbel-max trick).

    In one `generate` call the sampler draws different random numbers for every row, so member `i`'s `j`-th row would
    not sample with the same numbers as member `k`'s `j`-th row, as the one-member-at-a-time evaluation does. This
    processor adds to row `j` the Gumbel noise of row `j % rows_per_member`, drawn from `(seed, sequence length)`, and
    generation then takes the argmax (`do_sample=False`): `argmax(logits / temperature + gumbel)` is a sample of
    `softmax(logits / temperature)`. A member evaluated alone with the same processor draws the same numbers.
    Put top-k/top-p warpers before it in the `logits_processor` list; `do_sample=False` does not add them.

    Args:
        seed (`int`):
            The step's sampling seed (see `noise.sampling_seed`).
        rows_per_member (`int`):
            Rows of each member in the batch.
        temperature (`float`, *optional*, defaults to `1.0`):
            Sampling temperature.
    """

    def __init__(self, seed: int, rows_per_member: int, temperature: float = 1.0):
        if temperature <= 0:
            raise ValueError(f"CommonRandomGumbel samples with temperature > 0, got temperature={temperature}.")
        self.seed = seed
        self.rows_per_member = rows_per_member
        self.temperature = temperature

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        rows, vocab = scores.shape
        if rows % self.rows_per_member:
            raise ValueError(f"A batch of {rows} rows is not whole members of rows_per_member={self.rows_per_member}.")
        generator = torch.Generator(device=scores.device).manual_seed(derive_seed(self.seed, input_ids.shape[1]))
        uniform = torch.rand((self.rows_per_member, vocab), generator=generator, device=scores.device)
        gumbel = -torch.log(-torch.log(uniform.clamp_min(torch.finfo(uniform.dtype).tiny)))
        return scores.float() / self.temperature + gumbel.repeat(rows // self.rows_per_member, 1)


def common_random_sampling(
    seed: int,
    rows_per_member: int,
    temperature: float,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
) -> LogitsProcessorList:
    """The logits processors that sample a batched population with common random numbers (pass them to `generate`
    with `do_sample=False`): temperature and the top-k / top-p / min-p filters, then `CommonRandomGumbel`."""
    processors = [TemperatureLogitsWarper(temperature)]
    if top_k:
        processors.append(TopKLogitsWarper(top_k))
    if top_p is not None and top_p < 1.0:
        processors.append(TopPLogitsWarper(top_p))
    if min_p:
        processors.append(MinPLogitsWarper(min_p))
    return LogitsProcessorList([*processors, CommonRandomGumbel(seed, rows_per_member)])
