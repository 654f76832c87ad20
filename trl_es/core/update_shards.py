"""Which process owns each tensor: population-parallel ES's update, shared by the processes (each tensor's direction
computed once, then broadcast), and the master split over a group of processes.

Every process applies the same update. Drawing every member's noise of the whole model for it would be the same work
on each process, so `UpdateShards` has each process compute the directions of a share of the tensors, exactly as one
process would, and broadcasts them bit for bit. `EngineShards` deals the tensors the same way over a group (the
processes of a tensor-parallel engine, or of a server run), whose owners keep each tensor's master, and moves each
tensor from its owner to the processes that need it (a checkpoint's, also for `UpdateShards`' optimizer state).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import torch

from .tensor_files import TensorStream


class UpdateShards:
    """Split the update's noise draws over the processes, by tensor, without changing a bit of the result.

    Tensors are taken in rounds of P, sorted by size so that the tensors of a round cost about the same: in each round
    process `k` computes the direction of the round's `k`-th tensor (summing the members in the fixed order, exactly
    as one process would), then every process receives all of the round's directions by broadcast. So each process
    draws 1/P of the noise, holds at most P directions at once, and applies the same bits as with one process.
    The exchange moves (P - 1)/P of the model in float32 to every process per step: cheaper than drawing N noises
    on one machine, not always across machines on a slow network (`ESConfig.shard_update=False` turns it off).

    Args:
        rank (`int`): This process's index in the default process group.
        num_processes (`int`): The number of processes, P.
    """

    def __init__(self, rank: int, num_processes: int):
        self.rank = rank
        self.num_processes = num_processes

    def rounds(self, shapes: Mapping[str, torch.Size], names: list[str]) -> Iterator[list[str]]:
        """The tensors of `names` in rounds of P, smallest first: process `k` owns the `k`-th of each round."""
        by_size = sorted(names, key=lambda name: shapes[name].numel())
        for start in range(0, len(by_size), self.num_processes):
            yield by_size[start : start + self.num_processes]

    def owned(self, shapes: Mapping[str, torch.Size], names: list[str]) -> set[str]:
        """The tensors whose direction (and `es_optimizer` state) this process computes and keeps."""
        return {round_names[self.rank] for round_names in self.rounds(shapes, names) if self.rank < len(round_names)}

    def all_gather(self, value) -> list:
        """Every process's `value`, in rank order (collective)."""
        return all_gather_objects(value, self.num_processes)

    def directions(
        self,
        shapes: Mapping[str, torch.Size],
        names: list[str],
        direction_of: Callable[[str], torch.Tensor],
        device: torch.device,
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """`(name, direction_of(name))` for every tensor in `names` (float32 of `shapes[name]`, on `device`), in
        rounds: `direction_of` runs only on the tensor's owner, and its result reaches every process."""
        for round_names in self.rounds(shapes, names):
            received = [
                direction_of(name) if owner == self.rank else torch.empty(shapes[name], device=device)
                for owner, name in enumerate(round_names)
            ]
            for owner, direction in enumerate(received):
                torch.distributed.broadcast(direction, src=owner)
            yield from zip(round_names, received, strict=True)

    def owners(self, shapes: dict[str, torch.Size]) -> EngineShards:
        """The owners of the tensors of `shapes` (those the update changes) as an [`EngineShards`] of the default
        group: the same process owns each, so a tensor's `es_optimizer` state goes from there into a checkpoint."""
        return EngineShards(torch.distributed.group.WORLD, shapes)


class EngineShards:
    """Which process of an engine's group owns each tensor's master, and the group's collectives. Dealt as
    [`UpdateShards`] deals its rounds: the k-th smallest tensor to process k mod P.

    Args:
        group (`torch.distributed.ProcessGroup`): The processes that share the engine.
        shapes (`dict[str, torch.Size]`): Every tensor of the master, in model order.
    """

    def __init__(self, group, shapes: dict[str, torch.Size]):
        self.group = group
        self.ranks = torch.distributed.get_process_group_ranks(group)  # global ranks, in group order
        self.rank = torch.distributed.get_rank(group)
        self.shapes = shapes
        by_size = sorted(shapes, key=lambda name: shapes[name].numel())  # UpdateShards' rounds: owner k, k-th of each
        self.owner = {name: index % len(self.ranks) for index, name in enumerate(by_size)}

    def owns(self, name: str) -> bool:
        return self.owner[name] == self.rank

    def from_owner(
        self, name: str, value: torch.Tensor | None, shape: torch.Size, device, dtype: torch.dtype = torch.float32
    ) -> torch.Tensor:
        """Tensor `name` as its owner holds it (`value` there, in host memory or on `device`), on every process of
        the group (of `shape`, on `device`; float32, or sent cast to `dtype`: a bf16 engine's tensors travel in half
        the bytes, and the receivers get the bits they would have cast to)."""
        tensor = value.to(device, dtype) if self.owns(name) else torch.empty(shape, dtype=dtype, device=device)
        torch.distributed.broadcast(tensor, src=self.ranks[self.owner[name]], group=self.group)
        return tensor

    def to_receivers(
        self,
        name: str,
        value: torch.Tensor | None,
        shape: torch.Size,
        device,
        dtype: torch.dtype,
        receivers: list[int],
    ) -> torch.Tensor | None:
        """Tensor `name` from its owner (`value` there) to the processes of `receivers` (group ranks) only, point to
        point, cast to `dtype`; returns it there (and on the owner if it is one of them), `None` elsewhere."""
        owner = self.owner[name]
        if self.rank != owner:
            if self.rank not in receivers:
                return None
            tensor = torch.empty(shape, dtype=dtype, device=device)
            torch.distributed.recv(tensor, src=self.ranks[owner], group=self.group)
            return tensor
        others = [receiver for receiver in receivers if receiver != owner]
        if not others and owner not in receivers:
            return None  # nobody needs it: no copy to the accelerator, no cast
        tensor = value.to(device, dtype)
        for receiver in others:
            torch.distributed.send(tensor, dst=self.ranks[receiver], group=self.group)
        return tensor

    def all_gather(self, value) -> list:
        """Every process's `value`, in group order."""
        return all_gather_objects(value, len(self.ranks), self.group)

    def receivers(self, receives: bool) -> list[int]:
        """The group ranks of the processes whose `receives` is true (collective)."""
        return [rank for rank, received in enumerate(self.all_gather(receives)) if received]

    def stream(
        self,
        entries: list[tuple[str, str]],
        read: Callable[[str], torch.Tensor],
        device,
        keep: bool = True,
        own: bool = False,
    ) -> TensorStream:
        """A [`TensorStream`] of `(key, tensor)` for each `(name, key)` of `entries` (float32, of tensor `name`'s
        shape): each sent by the owner of `name` (`read(key)` there) to the processes that `keep` them, point to point,
        as the stream is iterated (collective: the group iterates it to the end). What a checkpoint writes of a split
        master, or of the `es_optimizer` state split between the processes that share the update.

        With `own`, nothing travels: where a process of the group keeps them, each owner's stream is the entries it
        owns, which it writes itself (`keep` says which process saves; the others' streams are empty)."""
        receivers = self.receivers(keep)
        if own:
            owned = [(name, key) for name, key in entries if receivers and self.owns(name)]
            layout = {key: (self.shapes[name], torch.float32) for name, key in owned}
            return TensorStream(layout, ((key, read(key).to(torch.float32)) for _, key in owned))

        def tensors():
            for name, key in entries:
                value = read(key) if self.owns(name) else None
                sent = self.to_receivers(name, value, self.shapes[name], device, torch.float32, receivers)
                if keep:
                    yield key, sent
                del sent  # before the next is received: one tensor at a time

        layout = {key: (self.shapes[name], torch.float32) for name, key in entries} if keep else {}
        return TensorStream(layout, tensors())


def all_gather_objects(value, size: int, group=None) -> list:
    """Every process's `value` (any picklable object), in the order of `group`'s `size` processes (collective; a
    process alone, `size` 1, needs no process group)."""
    if size == 1:
        return [value]
    gathered = [None] * size
    torch.distributed.all_gather_object(gathered, value, group=group)
    return gathered
