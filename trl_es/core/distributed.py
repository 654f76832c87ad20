"""Population-parallel ES across processes: the distributed concerns of an ES step, in one place.

Every process sees the whole prompt batch of the step and evaluates its share of the population: in round `j`,
process `r` evaluates member `j * P + r`. Because every process runs the same number of rounds, the collectives that
score a round (TRL's reward gather) line up, and each round's gathered rewards are exactly the rewards of members
`jP .. jP + P - 1` in order. Every process then applies the same update from (seeds, coefficients), summed in member
order, so the weights do not depend on the number of processes. Drawing every member's noise again for that update
is work each process would repeat: `UpdateShards` splits it by tensor, each tensor's direction computed by one process
(in the same member order) and broadcast bit for bit.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from accelerate import Accelerator
from accelerate.utils import broadcast_object_list, gather_object

from .master import MasterWeights
from .noise import Member


def whole_batch(accelerator: Accelerator, local_inputs: list) -> list:
    """The step's whole prompt batch on every process (the dataloader gave each process a shard of it)."""
    if accelerator.num_processes == 1:
        return local_inputs
    return gather_object(local_inputs)


def check_population_divides(population_size: int, num_processes: int) -> None:
    if population_size % num_processes:
        lower = population_size - population_size % num_processes
        raise ValueError(
            f"population_size ({population_size}) must be a multiple of the number of processes ({num_processes}), "
            f"so that every process evaluates the same number of members. Use {lower or num_processes} or "
            f"{lower + num_processes}."
        )


def members_of_this_process(accelerator: Accelerator, members: list[Member]) -> list[Member]:
    """This process's members, one per round: `members[round * P + rank]`."""
    return members[accelerator.process_index :: accelerator.num_processes]


def from_process(accelerator: Accelerator, value, owner: int):
    """`value` as held by process `owner`, on every process."""
    if accelerator.num_processes == 1:
        return value
    payload = [value]
    broadcast_object_list(payload, from_process=owner)
    return payload[0]


def master_fingerprint(master: MasterWeights) -> list[int]:
    """One integer per master tensor, the sum of its float32 bit patterns, that any change of a single element changes.

    Computed where the master lives (no copy to the host, unlike a hash of the bytes), so checking agreement every
    step costs a read of the master, not a transfer and a SHA-256 of it."""
    sums = [tensor.view(torch.int32).sum(dtype=torch.int64) for tensor in master.tensors.values()]
    return torch.stack(sums).tolist() if sums else []


def check_ranks_agree(accelerator: Accelerator, master: MasterWeights, step: int) -> None:
    """Fail loudly if the processes' masters are not bitwise identical."""
    if accelerator.num_processes == 1:
        return
    fingerprints = gather_object([master_fingerprint(master)])
    if any(fingerprint != fingerprints[0] for fingerprint in fingerprints):
        names = list(master.tensors)
        differing = [names[i] for i, sums in enumerate(zip(*fingerprints, strict=True)) if len(set(sums)) > 1]
        raise RuntimeError(
            f"At step {step} the processes' ES masters disagree ({len(differing)} tensors differ between ranks, "
            f"first {differing[:3]}). Every process must apply the same update; check that all of them run the same "
            "code, seed and data."
        )


class UpdateShards:
    """Split the update's noise draws over the processes, by tensor, without changing a bit of the result.

    Tensors are taken in rounds of P, sorted by size so that the tensors of a round cost about the same: in each round
    process `k` computes the direction of the round's `k`-th tensor (summing the members in the fixed order, exactly
    as one process would), then every process receives all of the round's directions by broadcast. So each process
    draws 1/P of the noise, holds at most P directions at once, and applies the same bits as with one process.
    The exchange moves (P - 1)/P of the model in float32 to every process per step: cheaper than drawing N noises
    on one machine, not always across machines on a slow network (`ESConfig.shard_update=False` turns it off).
    """

    def __init__(self, rank: int, num_processes: int):
        self.rank = rank
        self.num_processes = num_processes

    def directions(
        self, master: MasterWeights, names: list[str], coefficients: dict[int, float]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """`(name, master.update_direction(name, coefficients))` for every tensor in `names`, in rounds."""
        by_size = sorted(names, key=lambda name: master.tensors[name].numel())
        for start in range(0, len(by_size), self.num_processes):
            round_names = by_size[start : start + self.num_processes]
            received = [
                master.update_direction(name, coefficients)
                if owner == self.rank
                else torch.empty_like(master.tensors[name])
                for owner, name in enumerate(round_names)
            ]
            for owner, direction in enumerate(received):
                torch.distributed.broadcast(direction, src=owner)
            yield from zip(round_names, received, strict=True)
