"""Population-parallel ES across processes: the distributed concerns of an ES step, in one place.

Every process sees the whole prompt batch of the step and evaluates its share of the population: in round `j`,
process `r` evaluates member `j * P + r`. Because every process runs the same number of rounds, the collectives that
score a round (TRL's reward gather) line up, and each round's gathered rewards are exactly the rewards of members
`jP .. jP + P - 1` in order. Every process then applies the same update from (seeds, coefficients), summed in member
order, so the weights do not depend on the number of processes (`update_shards.py` shares computing that update).

Processes that share one tensor-parallel engine form one evaluator ([`Evaluators`]): they load the same member and
generate the same completions together, so with E evaluators member `j * E + e` is round `j` of evaluator `e`, and
of each group's gathered values only its first process's are kept.
"""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class Evaluators:
    """Who evaluates which member: the `num_processes` processes in groups of `group_size` consecutive ones that
    share one engine (a tensor-parallel vLLM engine; 1 otherwise), each group one evaluator. In round `j`, evaluator
    `e` evaluates member `j * count + e`.

    Args:
        process_index (`int`): This process.
        num_processes (`int`): All processes, P.
        group_size (`int`, *optional*, defaults to `1`): Processes per evaluator; divides P.
    """

    process_index: int
    num_processes: int
    group_size: int = 1

    @classmethod
    def of(cls, accelerator: Accelerator, group_size: int = 1) -> Evaluators:
        return cls(accelerator.process_index, accelerator.num_processes, group_size)

    @property
    def count(self) -> int:
        """The number of evaluators, E."""
        return self.num_processes // self.group_size

    @property
    def index(self) -> int:
        """This process's evaluator."""
        return self.process_index // self.group_size

    def members(self, members: list[Member]) -> list[Member]:
        """This process's evaluator's members, one per round: `members[round * E + index]`."""
        return members[self.index :: self.count]

    def first_process(self, evaluator: int) -> int:
        """The first process of `evaluator`'s group, whose gathered values stand for the group's."""
        return evaluator * self.group_size

    def per_evaluator(self, per_process: torch.Tensor) -> torch.Tensor:
        """Of values gathered process-major (`(P, ...)`), those of each evaluator's first process (`(E, ...)`): the
        processes of a group hold the same values."""
        return per_process[:: self.group_size]


def gather_members(accelerator: Accelerator, local: torch.Tensor, evaluators: Evaluators) -> torch.Tensor:
    """This process's per-member values (`local`: one row per round) gathered into the whole population's, in member
    order (member `j * E + e` is evaluator `e`'s round `j`)."""
    if accelerator.num_processes == 1:
        return local
    gathered = accelerator.gather(local.to(accelerator.device)).cpu()  # process-major: (P x rounds, ...)
    rounds = local.shape[0]
    per_process = gathered.view(accelerator.num_processes, rounds, *local.shape[1:])
    return evaluators.per_evaluator(per_process).transpose(0, 1).reshape(-1, *local.shape[1:])


def check_population_divides(population_size: int, num_processes: int, group_size: int = 1) -> None:
    """Every evaluator (a process, or `group_size` processes sharing an engine) gets as many members."""
    evaluators = num_processes // group_size
    if population_size % evaluators:
        lower = population_size - population_size % evaluators
        who = (
            f"the number of processes ({num_processes})"
            if group_size == 1
            else f"the number of tensor-parallel engines ({num_processes} processes / {group_size} per engine = "
            f"{evaluators})"
        )
        raise ValueError(
            f"population_size ({population_size}) must be a multiple of {who}, so that every one evaluates the same "
            f"number of members. Use {lower or evaluators} or {lower + evaluators}."
        )


def members_of_this_process(accelerator: Accelerator, members: list[Member]) -> list[Member]:
    """This process's members, one per round, where every process is an evaluator: `members[round * P + rank]`."""
    return Evaluators.of(accelerator).members(members)


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


def check_ranks_agree(
    accelerator: Accelerator, master: MasterWeights, step: int, resumed_from: str | None = None
) -> None:
    """Fail loudly if the processes' masters are not bitwise identical (each tensor compared between the processes
    that hold it: all of them, or its owners where a master is split over an engine's processes). Step 0 is the start:
    the masters just built from each process's model, or read from the checkpoint `resumed_from`."""
    if accelerator.num_processes == 1:
        return
    per_process = gather_object([dict(zip(master.tensors, master_fingerprint(master), strict=True))])
    values: dict[str, set[int]] = {}
    for fingerprints in per_process:
        for name, value in fingerprints.items():
            values.setdefault(name, set()).add(value)
    differing = [name for name, seen in values.items() if len(seen) > 1]
    if not differing:
        return
    found = f"{len(differing)} tensors differ between ranks, first {differing[:3]}"
    if step == 0 and resumed_from is not None:
        raise RuntimeError(
            f"The processes resumed from {resumed_from} with different weights ({found}): they read different copies "
            "of it. With save_on_each_node each machine reads the copy on its own disk; make every machine's copy "
            "the same checkpoint (copy one machine's to the others), or resume from a folder every machine shares."
        )
    if step == 0:
        raise RuntimeError(
            f"The processes start from different weights ({found}). ES wraps the model in no "
            "DistributedDataParallel, which would copy rank 0's weights to the others: build the model the same on "
            "every process (load it from a checkpoint, or call transformers.set_seed before creating it)."
        )
    raise RuntimeError(
        f"At step {step} the processes' ES masters disagree ({found}). Every process must apply the same update; "
        "check that all of them run the same code, seed and data."
    )
