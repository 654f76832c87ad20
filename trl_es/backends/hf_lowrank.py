"""The Hugging Face backend for low-rank (EGGROLL) members: the whole population in one batched `model.generate` call.

The rows of a batch are member-major: member `i` owns rows `i * rows_per_member` to `(i + 1) * rows_per_member - 1`,
in the prefill and in every decoding step (generate keeps the row order; the KV cache holds each row's own perturbed
keys and values). Forward hooks add each member's perturbation to its rows (see `core/lowrank.py` for the noise):

- `nn.Linear`: `y_i = x_i W.T + b + s_i sigma / sqrt(r) * (x_i B_i) A_i.T`;
- `nn.Embedding`: `e_i = W[ids_i] + s_i sigma / sqrt(r) * A_i[ids_i] B_i.T`;

so the hooks need no per-row bookkeeping: the rows are viewed as `(members, rows_per_member * seq, in)` and two
batched matmuls cost O(rows * seq * rank * (in + out)). With `other_parameters="full"`, a `nn.Linear` bias adds its
member's noise to the output (exact: the output is affine in the bias), and any other module (RMSNorm, LayerNorm, ...)
is re-run once per member with its perturbed parameters, vectorised with `torch.func.vmap`. Re-running is exact
whatever the module computes (RMSNorm's `w * x`, Gemma's `(1 + w) * x`, LayerNorm's affine), where rescaling the output
by `(w + delta) / w` would not be (it divides by weights near zero). It needs a leaf module called with one tensor;
anything else raises `NotImplementedError` naming the module.

Sampling: one `generate` call draws different random numbers for every row, which breaks the common random numbers
of a step (member `i`'s `j`-th row must sample like every other member's `j`-th row); `CommonRandomGumbel` restores
them, and `RowSeededGumbel` gives each row of `generate_rows` its own seed's (see `gumbel.py`). In float32 a member's
outputs match explicitly written weights to rounding; in bf16 the hook adds its term to the bf16 base output instead
of rounding `W + delta` to bf16, so they are close, not bitwise equal.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext

import torch
from torch import nn

from ..core.lowrank import LowRankMasterWeights, lowrank_factors
from ..core.noise import Member, parameter_noise
from .base import PhaseTimer, rows_by_member
from .gumbel import common_random_sampling
from .hf import HFBackend, TokenIds, hf_generate
from .sampling import SamplingSettings


class HFLowRankBackend(HFBackend):
    """Low-rank members evaluated by the trainer's own model, `members_per_call` of them in one batched `generate`:
    the batch is member-major and forward hooks add each member's perturbation (see the module docstring). No weight
    is written, so the model always holds the centre (its float32 evolving parameters can be the master itself).

    Args:
        model (`PreTrainedModel`): The trainer's (unwrapped) model, whose parameter names built `master`.
        parameters (`dict[str, torch.nn.Parameter]`): Its evolving parameters, by the master's names.
        master ([`LowRankMasterWeights`]): The float32 source of truth.
        tokens ([`TokenIds`]): Padding and EOS ids.
        members_per_call (`int`, *optional*): Members per `generate` call (all of them by default).
        pad_to_multiple_of (`int`, *optional*): As `GRPOConfig.pad_to_multiple_of`.
    """

    def __init__(
        self,
        model,
        parameters: dict[str, torch.nn.Parameter],
        master: LowRankMasterWeights,
        tokens: TokenIds,
        members_per_call: int | None = None,
        pad_to_multiple_of: int | None = None,
    ):
        super().__init__(model, parameters, master, tokens, pad_to_multiple_of)
        self.members_per_call = members_per_call

    def generate(self, members, prompt_ids, sampling, seed, timer=None):
        timer = timer or PhaseTimer()
        rows = len(prompt_ids)
        per_call = self.members_per_call or len(members)
        completions = []
        for start in range(0, len(members), per_call):
            batch = members[start : start + per_call]
            with timer("generate"), lowrank_population(self.model, self.master, batch, rows):
                generated = self._generate_population_rows(prompt_ids * len(batch), sampling, seed, rows)
            completions += [generated[i * rows : (i + 1) * rows] for i in range(len(batch))]
        return completions

    def generate_rows(self, rows, sampling, timer=None):
        """Every row on its member's perturbation (the centre's rows on none), `members_per_call` members (the centre
        counting as one) in one batched `generate`. The hooks need the same number of rows for every member of a
        call: a member with fewer rows than the call's largest gets copies of its first row, whose completions are
        dropped. Sampled rows draw their own seed's numbers (`RowSeededGumbel`)."""
        if not rows:
            return []
        timer = timer or PhaseTimer()
        groups = rows_by_member(rows)
        members = list(groups)
        per_call = self.members_per_call or len(members)
        completions: list[list[int]] = [[] for _ in rows]
        for start in range(0, len(members), per_call):
            batch = members[start : start + per_call]
            rows_per_member = max(len(groups[member]) for member in batch)
            # Member-major slots, `rows_per_member` per member; None is a padding row, a copy of its member's first.
            slots = [groups[member] + [None] * (rows_per_member - len(groups[member])) for member in batch]
            sources = [rows[block[0] if index is None else index] for block in slots for index in block]
            with timer("generate"), self._population(batch, rows_per_member):
                generated = self.generate_loaded_rows(
                    [row.prompt_ids for row in sources], [row.seed for row in sources], sampling
                )
            for index, completion in zip([index for block in slots for index in block], generated, strict=True):
                if index is not None:
                    completions[index] = completion
        return completions

    def _population(self, members: list[Member | None], rows_per_member: int):
        """The hooks that put each member's rows on its perturbation (the centre's on none); no hook for the centre
        alone."""
        if members == [None]:
            return nullcontext()
        perturbed = [_CENTRE if member is None else member for member in members]
        return lowrank_population(self.model, self.master, perturbed, rows_per_member)

    @contextmanager
    def member_loaded(self, member: Member | None, timer: PhaseTimer | None = None) -> Iterator[None]:
        """Nothing to keep in place: the model holds the centre and every call adds its rows' perturbations."""
        yield

    def _generate_population_rows(
        self, prompt_ids, sampling: SamplingSettings, seed: int | None, rows_per_member: int
    ):
        """`generate` over a batched population's rows; sampled rows keep common random numbers (every member's j-th
        row draws the same Gumbel noise), where a plain sampled `generate` would give every row its own."""
        if sampling.temperature == 0:
            return self._generate(prompt_ids, sampling, seed)
        processors = common_random_sampling(
            seed or 0, rows_per_member, sampling.temperature, sampling.top_k, sampling.top_p, sampling.min_p
        )
        # The processors sample; `generate` takes their argmax.
        kwargs = sampling.with_(temperature=0).generate_kwargs(self.tokens.pad, self.tokens.bos, list(self.tokens.eos))
        return hf_generate(self.model, prompt_ids, kwargs, self.tokens, seed, self.pad_to_multiple_of, processors)


# The centre as a member of a batched population: its perturbation is `0 * sigma * eps`, exactly zero.
_CENTRE = Member(seed=0, sign=0)


def _member_factors(
    master: LowRankMasterWeights, name: str, members: Sequence[Member], like: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stacked factors of one matrix for the population, on `like`'s device and dtype: `A` (`N x out x r`) and `B`
    scaled by `sign * sigma / sqrt(r)` (`N x in x r`). A seed shared by an antithetic pair is drawn once."""
    shape, device = master.tensors[name].shape, master.tensors[name].device
    drawn = {
        seed: lowrank_factors(seed, name, shape, master.rank, device)
        for seed in dict.fromkeys(m.seed for m in members)
    }
    a = torch.stack([drawn[m.seed][0] for m in members])
    b = torch.stack([drawn[m.seed][1] * (m.sign * master.sigma / math.sqrt(master.rank)) for m in members])
    return a.to(like.device, like.dtype), b.to(like.device, like.dtype)


def _member_values(
    master: LowRankMasterWeights, name: str, members: Sequence[Member], like: torch.Tensor
) -> torch.Tensor:
    """`cast(master + sign * sigma * eps)` of one full-rank tensor for each member (`N x *shape`): the values the
    explicit path writes."""
    tensor = master.tensors[name]
    stacked = torch.stack(
        [
            parameter_noise(m.seed, name, tensor.shape, tensor.device).mul_(m.sign * master.sigma).add_(tensor)
            for m in members
        ]
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
        # The module's output is a fresh tensor that nothing else holds yet: the terms are added into it in place.
        result = output.reshape(members, -1, output.shape[-1])
        if self.lowrank is not None:
            a, b = self.lowrank
            if isinstance(module, nn.Embedding):
                ids = inputs.reshape(members, -1) + torch.arange(members, device=inputs.device)[:, None] * a.shape[1]
                _add_product(result, a.reshape(-1, a.shape[-1])[ids], b)
            else:
                _add_product(result, _times(inputs.reshape(members, -1, inputs.shape[-1]), b), a)
        if self.bias_noise is not None:
            result.add_(self.bias_noise[:, None, :])
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


# A rank-1 member's terms are outer and inner products: as broadcast element-wise operations they cost one pass over
# the activations, where batched matrix products with an inner or outer dimension of 1 ran 5-10x slower on CPU.


def _times(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`x @ b` for `x` (`N x rows x in`) and `b` (`N x in x r`)."""
    if b.shape[-1] == 1:
        return (x * b.transpose(1, 2)).sum(dim=-1, keepdim=True)
    return torch.bmm(x, b)


def _add_product(result: torch.Tensor, low: torch.Tensor, a: torch.Tensor) -> None:
    """`result += low @ a.T` in place, for `low` (`N x rows x r`) and `a` (`N x out x r`)."""
    if a.shape[-1] == 1:
        result.addcmul_(low, a.transpose(1, 2))
    else:
        result.baddbmm_(low, a.transpose(1, 2))


def _population_hooks(
    model: nn.Module, master: LowRankMasterWeights, members: Sequence[Member], rows_per_member: int
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
                    factors[name] = _member_factors(master, name, members, param)
                lowrank = factors[name]
            else:
                full[attribute] = _member_values(master, name, members, param)
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
    model: nn.Module, master: LowRankMasterWeights, members: Sequence[Member], rows_per_member: int
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
        rows_per_member (`int`):
            Rows of each member in every forward: prompts per member x `num_return_sequences` (x `num_beams`). Every
            forward must have exactly `len(members) * rows_per_member` rows.

    Example:

    ```python
    batch = tokenizer(prompts * len(members), return_tensors="pt", padding=True)  # member-major, left-padded
    with lowrank_population(model, master, members, rows_per_member=len(prompts)):
        ids = model.generate(**batch, do_sample=False, max_new_tokens=64)
    completions_of_member_i = ids[i * len(prompts) : (i + 1) * len(prompts)]
    ```
    """
    if rows_per_member < 1:
        raise ValueError(f"rows_per_member must be >= 1, got {rows_per_member}.")
    handles = []
    try:
        for module, hook in _population_hooks(model, master, members, rows_per_member):
            handles.append(module.register_forward_hook(hook, with_kwargs=True))
        yield
    finally:
        for handle in handles:
            handle.remove()
