"""Running a test's worker on several real processes joined by gloo over 127.0.0.1 (used by tests/core/)."""

import torch.distributed as dist
import torch.multiprocessing as mp

from benchmarks.harness import free_port


def run_on_processes(worker, world: int, *args) -> dict:
    """`worker(rank, world, *args)` on `world` spawned processes, each in the process group; returns what each stored
    in `results[rank]` (the worker's last argument, a shared dict)."""
    results = mp.Manager().dict()
    mp.start_processes(_in_group, args=(worker, world, free_port(), args, results), nprocs=world, start_method="spawn")
    return dict(results)


def _in_group(rank: int, worker, world: int, port: int, args: tuple, results) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        worker(rank, world, *args, results)
    finally:
        dist.destroy_process_group()
