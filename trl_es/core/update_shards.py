"""Population-parallel ES's update, shared by the processes: each tensor's direction computed once, then broadcast.

Every process applies the same update. Drawing every member's noise of the whole model for it would be the same work
on each process, so `UpdateShards` has each process compute the directions of a share of the tensors, exactly as one
process would, and broadcasts them bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import torch


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

    def gathered(
        self,
        shapes: Mapping[str, torch.Size],
        names: list[str],
        state: dict[str, torch.Tensor],
        suffixes: tuple,
        device: torch.device,
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """Per-tensor state kept by each tensor's owner (`state["<name>.<suffix>"]`, float32 of `shapes[name]`, in
        host memory or on `device`), yielded on every process as `(key, tensor)` on `device`, one at a time.
        Collective: every process iterates to the end."""
        for round_names in self.rounds(shapes, names):
            for owner, name in enumerate(round_names):
                for key in (f"{name}.{suffix}" for suffix in suffixes):
                    mine = owner == self.rank
                    received = state[key].to(device) if mine else torch.empty(shapes[name], device=device)
                    torch.distributed.broadcast(received, src=owner)
                    yield key, received
                    del received  # before the next is received: one tensor at a time


def all_gather_objects(value, size: int, group=None) -> list:
    """Every process's `value` (any picklable object), in the order of `group`'s `size` processes (collective)."""
    gathered = [None] * size
    torch.distributed.all_gather_object(gathered, value, group=group)
    return gathered
