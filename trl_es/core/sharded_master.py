"""The master split over the processes that share one tensor-parallel engine, or over the training processes of a
server run (issue 29).

The k processes of a tensor-parallel vLLM engine evaluate the same members together, so each needs every member's
tensors, but none needs the whole float32 master: each tensor's master lives on one owner of the group (dealt by size
as `UpdateShards` deals them), which computes its member values and its updates and broadcasts them to the group. A
process then holds about 1/k of the master; members and updates are bitwise those of an unsplit master. The training
processes of a server run split theirs the same way: the servers keep masters of their own.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Mapping

import torch

from .consistency import combined_digest, optimizer_digest, optimizer_state_digests, tensor_digests
from .direction_optimizer import STATE_SUFFIXES
from .guards import NonFiniteError, agree_on_non_finite
from .master import MasterWeights, master_device
from .noise import Member
from .released_weights import full_shape, is_released
from .tensor_chunks import squared_distance, squared_norm
from .tensor_files import TensorStream
from .update_shards import EngineShards, UpdateShards


class ShardedMasterWeights(MasterWeights):
    """A [`MasterWeights`] that holds the tensors this process owns in its engine's group; the others are read
    from their owners when a member or the centre is written. Every method that reads a tensor this process does not
    own is collective over the group: the group calls it together, in the same order.

    Args:
        parameters (`dict[str, torch.Tensor]`): The evolving parameters by name (the model's, holding the centre).
        sigma (`float`): Noise scale of the members.
        shards ([`EngineShards`]): Who owns which tensor.
        share_float32 (`bool`, *optional*, defaults to `False`): As in [`MasterWeights`], for the owned tensors.
        offload (`bool`, *optional*, defaults to `False`): As in [`MasterWeights`]: the owned tensors in host memory.
        device (`torch.device` or `str`, *optional*): As in [`MasterWeights`].
    """

    def __init__(
        self,
        parameters: dict[str, torch.Tensor],
        sigma: float,
        shards: EngineShards,
        share_float32: bool = False,
        offload: bool = False,
        device: torch.device | str | None = None,
    ):
        owned = {name: param for name, param in parameters.items() if shards.owns(name)}
        device = master_device(parameters, device)  # a process may own no tensor
        super().__init__(owned, sigma, share_float32=share_float32, offload=offload, device=device)
        self.shards = shards
        self.parameters = parameters  # the model's, holding the centre where this process keeps the model
        self.full_shapes = {name: full_shape(param) for name, param in parameters.items()}  # a released one's too
        self.parameter_dtypes = {name: param.dtype for name, param in parameters.items()}

    def names(self) -> list[str]:
        return list(self.full_shapes)

    def perturbed(self, member: Member, dtype: torch.dtype = torch.float32) -> Iterator[tuple[str, torch.Tensor]]:
        """Every tensor of `member` (collective): each computed by its owner and sent in `dtype`."""
        for name, shape in self.full_shapes.items():
            value = self.perturbed_tensor(name, member) if self.shards.owns(name) else None
            yield name, self.shards.from_owner(name, value, shape, self.device, dtype)

    def centre(self, dtype: torch.dtype = torch.float32) -> Iterator[tuple[str, torch.Tensor]]:
        """Every tensor of the master (collective), sent in `dtype` (a checkpoint's: float32)."""
        for name, shape in self.full_shapes.items():
            yield name, self.shards.from_owner(name, self._stored_if_owned(name), shape, self.device, dtype)

    @torch.no_grad()
    def write_centre_into(self, parameters: Mapping[str, torch.Tensor]) -> None:
        """As [`MasterWeights.write_centre_into`] (collective): each owner sends its tensors, in their parameter's
        dtype, only to the processes that keep the model. In a server run, or a tensor-parallel engine's group, that
        is the process that saves, if any; the others receive nothing (each received the whole master in float32
        until 2026-12-06)."""
        keeps = not all(map(is_released, parameters.values()))
        keepers = self.shards.receivers(keeps)
        for name, shape in self.full_shapes.items():
            value, parameter, dtype = self._stored_if_owned(name), parameters[name], self.parameter_dtypes[name]
            centre = self.shards.to_receivers(name, value, shape, self.device, dtype, keepers)
            if keeps and not self.holds(name, parameter):
                parameter.copy_(centre)

    def _stored_if_owned(self, name: str) -> torch.Tensor | None:
        """Tensor `name` as stored (in host memory when offloaded: read once, by the cast that sends it)."""
        return self.stored(name) if name in self.tensors else None

    def apply_update(self, coefficients, lr, weight_decay=0.0, shards: UpdateShards | None = None) -> float:
        """Each owner updates its tensors (`shards` is not used: the group's owners share the work already); the norm
        of the whole step sums the owners' parts in tensor order, as one process would. A non-finite step found by
        one owner stops every process of the group."""
        try:
            squared_norms, error = self._apply_steps(coefficients, lr, weight_decay, None), None
        except NonFiniteError as raised:
            squared_norms, error = {}, str(raised)
        parts = self.shards.all_gather((squared_norms, error))
        errors = [error for _, error in parts if error is not None]
        if errors:
            raise NonFiniteError(errors[0])
        merged = {name: value for part, _ in parts for name, value in part.items()}
        total = 0.0
        for name in self.full_shapes:
            total += merged[name]
        return math.sqrt(total)

    def restore_optimizer(self, tensors: Mapping[str, torch.Tensor], metadata: dict, shards=None) -> None:
        """Continue a checkpoint's `es_optimizer` state: each process reads, checks and keeps the state of the tensors
        it owns (collective: a non-finite value found by one is raised by all)."""
        # Every key is checked.
        self._restore_optimizer(tensors, metadata, self.full_shapes, set(self.tensors), self.shards.all_gather)

    def optimizer_stream(self, shards=None, keep: bool = True, own: bool = False) -> TensorStream:
        """The whole `es_optimizer` state, each tensor's from its owner to the processes that `keep` it, or with `own`
        each owner's to itself (collective; see [`checkpoint_stream`])."""
        suffixes = STATE_SUFFIXES[self.optimizer.settings.name]
        if not suffixes or self.optimizer.updates == 0:  # no state yet: it is created by the first update
            return TensorStream.of({})
        entries = [(name, f"{name}.{suffix}") for name in self.full_shapes for suffix in suffixes]
        return self.shards.stream(entries, self.optimizer.state_dict().__getitem__, self.device, keep, own)

    def digests(self) -> tuple[str, str]:
        """As [`MasterWeights.digests`], from the per-tensor digests of every owner (collective): no tensor travels."""
        parts = self.shards.all_gather((tensor_digests(self.state_dict()), optimizer_state_digests(self.optimizer)))
        tensors = {name: digest for part, _ in parts for name, digest in part.items()}
        state = {key: digest for _, part in parts for key, digest in part.items()}
        return combined_digest(tensors), optimizer_digest(self.optimizer, state)

    def checkpoint_stream(self, names, keep: bool = True, own: bool = False) -> TensorStream:
        """As [`MasterWeights.checkpoint_stream`], each tensor sent by its owner to the processes that `keep` it, point
        to point, when the writer asks for it (collective); with `own`, where the group holds a process that keeps
        them, each owner's own tensors, which it writes itself. Until 2026-12-06 every tensor was broadcast to the
        group and gathered whole on the accelerator of the process that saves: a 70B master is 280 GB."""
        return self.shards.stream([(name, name) for name in names], self.stored, self.device, keep, own)

    def load_saved(self, saved: Mapping[str, torch.Tensor]) -> None:
        """As [`MasterWeights.load_saved`], but collective whatever `saved` holds: another process of the group may
        have its share to read where this one has none (a float32 model's process that loaded the checkpoint's
        weights, beside one that did not)."""
        self.load_state_dict(self._with_saved(saved))

    def load_state_dict(self, tensors: dict[str, torch.Tensor]) -> None:
        """Load the owned tensors from `tensors` (a whole master, or any part holding them; collective: a non-finite
        value found by one process is raised by all)."""
        owned = {name: tensors[name] for name in tensors if name in self.tensors}
        agree_on_non_finite(functools.partial(super().load_state_dict, owned), self.shards.all_gather)

    def relative_distance(self, reference: dict[str, torch.Tensor]) -> float:
        """As [`MasterWeights.relative_distance`], reading the tensors other processes own from the model's
        parameters (the centre, in the model's dtype): no collective, as only a process that saves calls it (it keeps
        the model)."""
        if any(map(is_released, self.parameters.values())):
            raise RuntimeError(
                "relative_distance reads the model's weights, which this process released (it saves no "
                "checkpoint). Compute it on a process that saves (`should_save`)."
            )
        diff, base = 0.0, 0.0
        for name, parameter in self.parameters.items():
            value = self.tensors[name] if name in self.tensors else parameter.detach()
            ref = reference[name].to(value.device)  # in its own dtype: cast a slice at a time
            diff += squared_distance(value, ref)
            base += squared_norm(ref)
        return math.sqrt(diff / base) if base > 0 else 0.0
