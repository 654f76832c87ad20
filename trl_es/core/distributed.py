"""Population-parallel ES across processes: the distributed concerns of an ES step, in one place.

Every process sees the whole prompt batch of the step and evaluates its share of the population: in round `j`,
process `r` evaluates member `j * P + r`. Because every process runs the same number of rounds, the collectives that
score a round (TRL's reward gather) line up, and each round's gathered rewards are exactly the rewards of members
`jP .. jP + P - 1` in order. Every process then applies the same update from (seeds, coefficients), summed in member
order, so the weights do not depend on the number of processes (`update_shards.py` shares computing that update).
"""

from __future__ import annotations

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


def every_process_value(accelerator: Accelerator, value: int) -> list[int]:
    """Each process's `value`, in process order, known to every process (one integer per process, gathered): e.g.
    the preemption signal each received, so that all stop after the same step."""
    if accelerator.num_processes == 1:
        return [value]
    return accelerator.gather(torch.tensor([value], device=accelerator.device)).tolist()


def gather_members(accelerator: Accelerator, local: torch.Tensor) -> torch.Tensor:
    """This process's per-member values (`local`: one row per round) gathered into the whole population's, in member
    order (member `j * P + r` is process `r`'s round `j`)."""
    if accelerator.num_processes == 1:
        return local
    gathered = accelerator.gather(local.to(accelerator.device)).cpu()  # process-major: (P x rounds, ...)
    processes, rounds = accelerator.num_processes, local.shape[0]
    return gathered.view(processes, rounds, *local.shape[1:]).transpose(0, 1).reshape(-1, *local.shape[1:])


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


def in_member_order(per_process: torch.Tensor) -> torch.Tensor:
    """Values of every member from `(processes, rounds)` (row `r`: process `r`'s members, one per round) in member
    order: member `j * P + r` is round `j` of process `r`."""
    return per_process.T.reshape(-1)


def gather_member_values(accelerator: Accelerator, local_values: torch.Tensor) -> torch.Tensor:
    """One value per member of the whole population, in member order, from this process's members' values."""
    if accelerator.num_processes == 1:
        return local_values
    gathered = accelerator.gather(local_values.to(accelerator.device)).cpu()
    return in_member_order(gathered.view(accelerator.num_processes, -1))


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
