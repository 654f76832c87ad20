"""Population-parallel ES's update, shared by the processes: each tensor's direction computed once, then broadcast.

Every process applies the same update. Drawing every member's noise of the whole model for it would be the same work
on each process, so `UpdateShards` has each process compute the directions of a share of the tensors, exactly as one
process would, and broadcasts them bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

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

    def directions(
        self, tensors: dict[str, torch.Tensor], names: list[str], direction_of: Callable[[str], torch.Tensor]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """`(name, direction_of(name))` for every tensor in `names` (shaped like `tensors[name]`), in rounds."""
        by_size = sorted(names, key=lambda name: tensors[name].numel())
        for start in range(0, len(by_size), self.num_processes):
            round_names = by_size[start : start + self.num_processes]
            received = [
                direction_of(name) if owner == self.rank else torch.empty_like(tensors[name])
                for owner, name in enumerate(round_names)
            ]
            for owner, direction in enumerate(received):
                torch.distributed.broadcast(direction, src=owner)
            yield from zip(round_names, received, strict=True)
