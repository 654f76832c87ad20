"""What the process that saves adds to its memory while it writes a checkpoint's ES state from a split master.

Two gloo processes split a float32 master (each owns half of the tensors) with its adam state, as the processes of a
tensor-parallel engine or of a server run do; process 0 saves. Each process resets its peak resident size
(`/proc/self/clear_refs`), writes (process 0) or sends (process 1) the checkpoint's ES state, and reports how far the
peak rose (`VmHWM - VmRSS` before), once as trl-es writes it (each tensor from its owner when the writer asks for it,
written and let go of: `save_es_state`) and once gathered whole first (the master and the adam state collected, the
starting weights read whole, then `save_file`, as the process that saves did before 2026-12-06), side by side in one
run:

    .venv/bin/python benchmarks/checkpoint_save_memory.py --tensors 32 --rows 2048 --cols 4096

On a GPU the gathered tensors were collected on the accelerator (a 70B master and its adam state: 840 GB), here in
host memory. Linux only (it reads `/proc/self/status`).
"""

import sys
import tempfile
from pathlib import Path

# Run as a script, Python puts benchmarks/ on sys.path; the `benchmarks` package needs the repository root.
REPOSITORY = str(Path(__file__).resolve().parents[1])
if REPOSITORY not in sys.path:
    sys.path.insert(0, REPOSITORY)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from benchmarks.harness import float32_gb, peak_growth_of_variants, resident_gb, split_master_shapes  # noqa: E402
from trl_es.core.checkpoint import ES_STATE_DIR, save_es_state  # noqa: E402
from trl_es.core.direction_optimizer import DirectionOptimizer, DirectionOptimizerSettings  # noqa: E402
from trl_es.core.sharded_master import ShardedMasterWeights  # noqa: E402
from trl_es.core.tensor_files import drain  # noqa: E402
from trl_es.core.update_shards import EngineShards  # noqa: E402
from trl_es.evaluation.metrics import StartingWeights  # noqa: E402

PROCESSES = 2
WRITINGS = {"streamed": "one tensor at a time (trl-es)", "gathered": "gathered whole, then saved"}


def save(rank: int, world: int, folder: Path, shapes: dict[str, tuple], writing: str, results) -> None:
    parameters = {name: torch.full(shape, 0.5, dtype=torch.bfloat16) for name, shape in shapes.items()}
    shards = EngineShards(dist.group.WORLD, {name: torch.Size(shape) for name, shape in shapes.items()})
    master = ShardedMasterWeights(parameters, 0.1, shards, device="cpu")
    master.optimizer = DirectionOptimizer(DirectionOptimizerSettings("adam"))
    master.apply_update({1: 1.0}, lr=1e-3)  # the adam state exists from the first update
    reference = StartingWeights.write(parameters) if rank == 0 else None  # the starting weights, in a file
    del parameters  # what the benchmark built: the model is the trainer's, in memory before and after
    output = folder / f"{writing}-rank{rank}"
    Path("/proc/self/clear_refs").write_text("5")  # the peak starts again from the present size
    before = resident_gb("VmRSS")
    masters = master.checkpoint_stream(master.names(), keep=rank == 0)
    optimizer_state = master.optimizer_stream(keep=rank == 0)
    if rank != 0:
        drain(masters)
        drain(optimizer_state)
    elif writing == "streamed":
        save_es_state(output, masters, reference, {"global_step": 1}, optimizer_state)
    else:
        gathered = {"master": dict(masters.tensors), "optimizer": dict(optimizer_state.tensors)}
        gathered["reference"] = dict(reference)  # read whole, as the gathered ones were written
        (output / ES_STATE_DIR).mkdir(parents=True)
        for name, tensors in gathered.items():
            save_file(tensors, output / ES_STATE_DIR / f"{name}.safetensors")
    results[rank] = resident_gb("VmHWM") - before


def main():
    shapes = split_master_shapes(__doc__)
    master_gb = float32_gb(shapes)
    print(f"ES state: float32 master {master_gb:.2f} GB, adam state {2 * master_gb:.2f} GB; {PROCESSES} processes")
    print(f"{'writing':<32}{'peak growth (GB): saves, sends':>34}")
    with tempfile.TemporaryDirectory(prefix="trl-es-save-memory-") as folder:
        growth = peak_growth_of_variants(save, PROCESSES, WRITINGS, Path(folder), shapes, widths=(32, 34))
    ratio = growth["streamed"][0] / max(growth["gathered"][0], 1e-9)
    print(f"checkpoint_save_memory_ratio (streamed / gathered, the process that saves): {ratio:.2f}")


if __name__ == "__main__":
    main()
