"""The float32 master copy of the evolving parameters: the single source of truth of an ES run.

Members are written from the master (`cast(master + sign * sigma * eps)`) and the centre is restored by copying the
master, never by adding and then subtracting noise: in bf16 that round trip leaves ~7.5% of the weights changed after
one cycle. The update is accumulated and applied in float32, because a bf16 step of lr=5e-4 is lost on ~37% of them.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Iterator, Mapping

import torch

from .consistency import master_digest, optimizer_digest
from .direction_optimizer import STATE_SUFFIXES, DirectionOptimizer
from .guards import agree_on_non_finite, check_finite_tensors, check_step_fits, check_update_settings
from .host_memory import HostTensors, host_copy
from .noise import Member, parameter_noise
from .released_weights import full_shape, is_released
from .tensor_chunks import largest_magnitude, squared_distance, squared_norm
from .tensor_files import TensorStream
from .update_shards import UpdateShards


class MasterWeights:
    """Float32 copies of named parameters, with the ES perturbation and update rules: the centre of the population.

    Args:
        parameters (`dict[str, torch.Tensor]`):
            The evolving parameters by name. Their values are copied; the master never writes into them.
        sigma (`float`):
            Noise scale of the members: member `(seed, sign)` is `master + sign * sigma * eps(seed)`. It lives here,
            next to the noise, so every backend writes or adds the same perturbation.
        share_float32 (`bool`, *optional*, defaults to `False`):
            Use float32 parameters themselves as their master instead of copying them, so updates land in them
            directly. Only valid when the parameters always hold the centre (members are generated elsewhere): it
            saves a float32 copy of the model.
        offload (`bool`, *optional*, defaults to `False`):
            Keep the master in host memory (`trl_es.core.host_memory`); everything is still computed on `device`,
            one tensor at a time, with the same results.
        device (`torch.device` or `str`, *optional*):
            Where the master lives and is computed: by default the parameters' device. A model kept in host memory
            gets its master on the accelerator, copied there one tensor at a time (a parameter on another device is
            never shared).
    """

    def __init__(
        self,
        parameters: dict[str, torch.Tensor],
        sigma: float,
        share_float32: bool = False,
        offload: bool = False,
        device: torch.device | str | None = None,
    ):
        self.sigma = sigma
        self.optimizer = DirectionOptimizer(offload=offload)  # `build_population` sets `ESConfig.es_optimizer`'s
        self.device = master_device(parameters, device)
        if offload:
            self.tensors = HostTensors({name: host_copy(param) for name, param in parameters.items()}, self.device)
        else:
            self.tensors = {
                name: param.detach()
                if share_float32 and is_float32_on(param, self.device)
                else float32_copy(param, self.device)
                for name, param in parameters.items()
            }
        self.shapes = {name: full_shape(param) for name, param in parameters.items()}
        self.shared = {name for name, param in parameters.items() if self.stored(name).data_ptr() == param.data_ptr()}
        # The dtype each tensor is written into: an update must stay finite there too, not only in float32.
        self.parameter_dtypes = {name: param.dtype for name, param in parameters.items()}

    def perturbed(self, member: Member, dtype: torch.dtype = torch.float32) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield `(name, master + sign * sigma * eps)` one tensor at a time (float32, or cast to `dtype`: the dtype
        the caller writes it into), so the noise of a whole model is never held at once."""
        for name in self.tensors:
            yield name, self.perturbed_tensor(name, member).to(dtype)

    def perturbed_tensor(self, name: str, member: Member) -> torch.Tensor:
        """`master + sign * sigma * eps` of tensor `name` (float32)."""
        master = self.tensors[name]
        noise = parameter_noise(member.seed, name, master.shape, master.device)
        return noise.mul_(member.sign * self.sigma).add_(master)

    def centre(self, dtype: torch.dtype = torch.float32) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield `(name, master)` for every tensor: the centre, as a backend writes it (float32, or cast to
        `dtype`)."""
        for name, value in self.tensors.items():
            yield name, value.to(dtype)

    @torch.no_grad()
    def write_centre_into(self, parameters: Mapping[str, torch.Tensor]) -> None:
        """Copy the centre into the model's `parameters`, except those that are (part of) the master's own storage
        and those this process released (it keeps no model: `core.released_weights`). A tensor's value is read only
        where it is written: the compensated master computes each read, and beside vLLM its pairs hold every
        parameter."""
        for name in self.tensors:
            parameter = parameters[name]
            if not self.holds(name, parameter) and not is_released(parameter):
                parameter.copy_(self.tensors[name])

    def update_direction(self, name: str, coefficients: dict[int, float]) -> torch.Tensor:
        """`sum_seed coef * eps(seed)` for one tensor, accumulated in the coefficients' (fixed) order."""
        shape = self.shapes[name]
        direction = torch.zeros(shape, device=self.device)
        for seed, coefficient in coefficients.items():
            if coefficient != 0.0:
                direction.add_(parameter_noise(seed, name, shape, self.device), alpha=coefficient)
        return direction

    def is_frozen(self, name: str) -> bool:
        """Whether tensor `name` is kept fixed: neither perturbed nor updated (every tensor evolves here)."""
        return False

    def apply_update(
        self,
        coefficients: dict[int, float],
        lr: float,
        weight_decay: float = 0.0,
        shards: UpdateShards | None = None,
    ) -> float:
        """`master <- master * (1 - lr * weight_decay) + lr * step` for every tensor that is not frozen, where the
        step is the direction as `self.optimizer` transforms it (plain ES: the direction itself); returns the L2 norm
        of `lr * step`. With `shards`, the processes share computing the steps (the result is bitwise the same): each
        tensor's owner draws its direction and transforms it with its share of the optimizer state.

        Raises `NonFiniteError` instead of writing a non-finite value: coefficients, `lr` and the decay factor are
        checked before any tensor changes, and each tensor's step before it is added, against float32 and the range
        of the parameter's own dtype (an overflow found there leaves the tensors before it updated, all finite)."""
        squared_norms = self._apply_steps(coefficients, lr, weight_decay, shards)
        total = 0.0
        for name in self.updated_names():  # in tensor order, however the steps came: the same float on any process
            total += squared_norms[name]
        return math.sqrt(total)

    def _apply_steps(
        self, coefficients: dict[int, float], lr: float, weight_decay: float, shards: UpdateShards | None
    ) -> dict[str, float]:
        """Apply the update to the tensors this master holds; returns each one's squared step norm."""
        check_update_settings(coefficients, lr, weight_decay)
        names = self.updated_names()
        self.optimizer.begin_update()

        def step_of(name: str) -> torch.Tensor:
            return self.optimizer.step(name, self.update_direction(name, coefficients))

        steps = ((name, step_of(name)) for name in names) if shards is None else shards.directions(
            self.shapes, names, step_of, self.device
        )  # fmt: skip
        squared_norms = {}
        for name, step in steps:
            step = step.mul_(lr)
            self._add_step(name, step, 1.0 - lr * weight_decay, lr)
            squared_norms[name] = squared_norm(step)
        return squared_norms

    def _add_step(self, name: str, step: torch.Tensor, decay: float, lr: float) -> None:
        """`master <- master * decay + step` for tensor `name`, once `check_step_fits` passed."""
        master = self.tensors[name]
        check_step_fits(name, largest_magnitude(master), step, decay, lr, self.parameter_dtypes[name])
        if decay != 1.0:
            master.mul_(decay)
        master.add_(step)
        self._written(name, master)

    def _written(self, name: str, value: torch.Tensor) -> None:
        """Called after `value`, read as `self.tensors[name]`, was changed in place: here it is the master itself (or,
        offloaded, its copy on the accelerator, stored back); a master that stores its tensors otherwise stores the
        new value."""
        if isinstance(self.tensors, HostTensors):
            self.tensors.store(name, value)

    def stored(self, name: str) -> torch.Tensor:
        """Tensor `name` as the master stores it (in host memory when offloaded)."""
        return self.state_dict()[name]

    def relative_distance(self, reference: dict[str, torch.Tensor]) -> float:
        """`||master - reference|| / ||reference||` over all tensors (0 when the reference is all zeros)."""
        diff, base = 0.0, 0.0
        for name, master in self.tensors.items():
            ref = reference[name].to(master.device)  # in its own dtype: cast a slice at a time
            diff += squared_distance(master, ref)
            base += squared_norm(ref)
        return math.sqrt(diff / base) if base > 0 else 0.0

    def names(self) -> list[str]:
        """Every tensor of the master, in model order (also those other processes own, where it is split)."""
        return list(self.shapes)

    def updated_names(self) -> list[str]:
        """The tensors an update changes, in master order."""
        return [name for name in self.tensors if not self.is_frozen(name)]

    def restore_optimizer(
        self, tensors: Mapping[str, torch.Tensor], metadata: dict, shards: UpdateShards | None = None
    ) -> None:
        """Continue a checkpoint's `es_optimizer` state (its tensors and `es_state.json`), checked against the
        tensors this master updates, and moved to their device (a checkpoint is read onto the CPU). With `shards`,
        this process reads and keeps the state of the tensors it owns only, and the processes raise a non-finite
        value that one of them found together (collective)."""
        shapes = {name: self.shapes[name] for name in self.updated_names()}
        kept = None if shards is None else shards.owned(shapes, list(shapes))
        self._restore_optimizer(tensors, metadata, shapes, kept, None if shards is None else shards.all_gather)

    def _restore_optimizer(self, tensors, metadata, shapes, kept, all_gather) -> None:
        """Load the `es_optimizer` state of the tensors `kept` (None: all) after checking every saved key against
        `shapes`; the processes of `all_gather`'s group raise a non-finite value that one of them read together."""
        load = functools.partial(self.optimizer.load_state_dict, tensors, metadata, shapes, kept=kept)
        if all_gather is None:
            load()
        else:
            agree_on_non_finite(load, all_gather)
        place = host_copy if isinstance(self.tensors, HostTensors) else (lambda tensor: tensor.to(self.device))
        state = self.optimizer.state
        for key in list(state):  # one at a time: each tensor read is let go as its copy is made
            state[key] = place(state[key])

    def optimizer_state(self, shards: UpdateShards | None = None) -> dict[str, torch.Tensor]:
        """The whole `es_optimizer` state, gathered (see [`optimizer_stream`]; collective with `shards`)."""
        return dict(self.optimizer_stream(shards).tensors)

    def optimizer_stream(
        self, shards: UpdateShards | None = None, keep: bool = True, own: bool = False
    ) -> TensorStream:
        """The whole `es_optimizer` state as a checkpoint writes it, one tensor at a time: with `shards`, each sent by
        its owner to the processes that `keep` it (collective: every process iterates it to the end; with
        `keep=False` it yields nothing), or with `own` the state each owner keeps, which it writes itself (see
        [`EngineShards.stream`])."""
        state = self.optimizer.state_dict()
        suffixes = STATE_SUFFIXES[self.optimizer.settings.name]
        if shards is None or not suffixes or self.optimizer.updates == 0:
            return TensorStream.of(state if keep else {})
        names = self.updated_names()
        entries = [(name, f"{name}.{suffix}") for name in names for suffix in suffixes]
        owners = shards.owners({name: self.shapes[name] for name in names})
        return owners.stream(entries, state.__getitem__, self.device, keep, own)

    def digests(self) -> tuple[str, str]:
        """The whole master's `master_digest` and its `es_optimizer`'s `optimizer_digest` (collective where the master
        is split over processes: each owner digests its own tensors)."""
        return master_digest(self.state_dict()), optimizer_digest(self.optimizer)

    def nbytes(self) -> int:
        """The bytes the master adds to the parameters (a tensor shared with a float32 parameter adds none)."""
        return sum(self.stored(name).nbytes for name in self.tensors if name not in self.shared)

    def holds(self, name: str, parameter: torch.Tensor) -> bool:
        """Whether `parameter` is (part of) the master's own storage of tensor `name`, which updates change in
        place: nothing needs to be copied into it."""
        return name in self.tensors and parameter.data_ptr() == self.stored(name).data_ptr()

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The master's tensors by name, as stored (float32; in host memory when offloaded)."""
        return self.tensors.host if isinstance(self.tensors, HostTensors) else self.tensors

    def full_state_dict(self, keep: bool = True) -> dict[str, torch.Tensor]:
        """Every tensor of the master, gathered (see [`checkpoint_stream`]; collective where the master is split)."""
        return dict(self.checkpoint_stream(self.names(), keep).tensors)

    def checkpoint_stream(self, names: Iterable[str], keep: bool = True, own: bool = False) -> TensorStream:
        """The master's tensors `names` (float32) as a checkpoint writes them, one at a time as the writer asks for
        each ([`write_safetensors`]): nothing is gathered beside the master. Collective where the master is split
        over processes (every process iterates it to the end; with `own`, each owner writes its own tensors instead);
        `keep=False`: a process that writes nothing, whose stream yields nothing. A whole master is written by the
        process that keeps it, `own` or not."""
        names = list(names) if keep else []
        layout = {name: (self.shapes[name], torch.float32) for name in names}
        return TensorStream(layout, ((name, self.stored(name)) for name in names))

    def load_saved(self, saved: Mapping[str, torch.Tensor]) -> None:
        """Load the tensors of `saved` (a checkpoint's masters, read as they are asked for) that this master keeps;
        the others keep their values (nothing is copied when `saved` is empty)."""
        if saved:
            self.load_state_dict(self._with_saved(saved))

    def _with_saved(self, saved: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Every tensor of the master: from `saved` where it holds one, else the master's own."""
        return {name: saved[name] if name in saved else kept for name, kept in self.state_dict().items()}

    def load_state_dict(self, tensors: dict[str, torch.Tensor]) -> None:
        missing = sorted(set(self.tensors) - set(tensors))
        unexpected = sorted(set(tensors) - set(self.tensors))
        if missing or unexpected:
            raise ValueError(
                f"The saved ES master does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}. "
                "Resume with the same model (and PEFT configuration) that wrote the checkpoint."
            )
        # `copy_` would broadcast a smaller tensor and cast any dtype: refuse both, and anything non-finite.
        for name, shape in self.shapes.items():
            saved = tensors[name]
            if saved.shape != shape or saved.dtype != torch.float32:
                raise ValueError(
                    f"The saved ES master of {name!r} is a {saved.dtype} tensor of shape {tuple(saved.shape)}, but a "
                    f"master is float32 with the parameter's shape {tuple(shape)}. Resume with the same model "
                    "(and PEFT configuration) that wrote the checkpoint."
                )
        check_finite_tensors(tensors, "The saved ES master tensors")
        for name, master in self.tensors.items():
            master.copy_(tensors[name])
            self._written(name, master)


def master_device(parameters: dict[str, torch.Tensor], device: torch.device | str | None) -> torch.device:
    """`device`, or the parameters' device when it is None (the CPU for no parameters). The CPU is one device whatever
    its index: Accelerate names it `cpu:<LOCAL_RANK>` where LOCAL_RANK is set, and CPU tensors say `cpu`."""
    if device is not None:
        device = torch.device(device)
        return torch.device("cpu") if device.type == "cpu" else device
    return next(iter(parameters.values())).device if parameters else torch.device("cpu")


def is_float32_on(tensor: torch.Tensor, device: torch.device) -> bool:
    """Whether `tensor` can serve as its own float32 master on `device`."""
    return tensor.dtype == torch.float32 and tensor.device == device


def float32_copy(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A float32 copy of `tensor` on `device` (made there from a tensor on another device, one tensor at a time). A
    released parameter has no values to copy: its master is only allocated, for `load_saved` to read from a
    checkpoint."""
    if is_released(tensor):
        return torch.empty(full_shape(tensor), dtype=torch.float32, device=device)
    return tensor.detach().to(device=device, dtype=torch.float32, copy=True)
