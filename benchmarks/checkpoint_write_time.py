"""How long a checkpoint's ES state of a split master takes to write: each owner writing its own share, side by side
(`save_es_state_shares`, what trl-es does where one process saves), against every tensor sent to the process that
saves, which writes them all (`save_es_state`, what it does with `save_on_each_node`, and did everywhere until
2026-12-07).

Two gloo processes split a float32 master with its adam state (the master of `checkpoint_save_memory.py`); process 0
saves, also the starting weights. Each repeat times both ways, alternating, from a barrier before to a barrier after
(every process done), and the medians are printed with their ratio:

    .venv/bin/python benchmarks/checkpoint_write_time.py --tensors 32 --rows 2048 --cols 4096

What the writers gain depends on the storage: several writers help where it takes them side by side (a parallel
filesystem, several disks), little on one local disk.
"""

import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

# Run as a script, Python puts benchmarks/ on sys.path; the `benchmarks` package needs the repository root.
REPOSITORY = str(Path(__file__).resolve().parents[1])
if REPOSITORY not in sys.path:
    sys.path.insert(0, REPOSITORY)

import torch.distributed as dist  # noqa: E402

from benchmarks.checkpoint_save_memory import WRITINGS, split_master, write  # noqa: E402
from benchmarks.harness import float32_gb, run_on_processes, split_master_shapes  # noqa: E402

PROCESSES = 2
REPEATS = 3
TIMED = ("shares", "streamed")


def timed_writes(rank: int, world: int, folder: Path, shapes: dict[str, tuple], results) -> None:
    master, reference = split_master(rank, shapes)
    seconds = {writing: [] for writing in TIMED}
    for repeat in range(REPEATS):
        for writing in TIMED:
            output = folder / f"{writing}-{repeat}"
            dist.barrier()
            started = time.perf_counter()
            write(rank, master, reference, output, writing)
            dist.barrier()
            seconds[writing].append(time.perf_counter() - started)
            if rank == 0:
                shutil.rmtree(output)  # the disk holds one checkpoint at a time
    results[rank] = seconds


def main():
    shapes = split_master_shapes(__doc__)
    master_gb = float32_gb(shapes)
    print(f"ES state: float32 master {master_gb:.2f} GB, adam state {2 * master_gb:.2f} GB, starting weights "
          f"{master_gb / 2:.2f} GB; {PROCESSES} processes, {REPEATS} repeats")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="trl-es-write-time-") as folder:
        seconds = run_on_processes(timed_writes, PROCESSES, Path(folder), shapes)[0]
    print(f"{'writing':<34}{'seconds (median)':>18}   each repeat")
    for writing in TIMED:
        runs = ", ".join(f"{value:.2f}" for value in seconds[writing])
        print(f"{WRITINGS[writing]:<34}{statistics.median(seconds[writing]):>18.2f}   {runs}")
    ratio = statistics.median(seconds["shares"]) / statistics.median(seconds["streamed"])
    print(f"checkpoint_write_time_ratio (each owner its share / sent to the saver): {ratio:.2f}")


if __name__ == "__main__":
    main()
