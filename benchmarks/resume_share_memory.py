"""What a process of a tensor-parallel engine adds to its host memory while it resumes its share of a checkpoint.

Two gloo processes share an engine's float32 master (each owns half of the tensors) and resume it, with its adam
state, from a checkpoint written here. Each process resets its peak resident size (`/proc/self/clear_refs`), resumes,
and reports how far the peak rose (`VmHWM - VmRSS` before), once reading the files as trl-es does (`TensorFiles`:
its own share, one tensor at a time) and once reading them whole first (`load_file`, as every process did before
2026-12-06), side by side in one run:

    .venv/bin/python benchmarks/resume_share_memory.py --tensors 32 --rows 2048 --cols 4096

Linux only (it reads `/proc/self/status`).
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
from safetensors.torch import load_file, save_file  # noqa: E402

from benchmarks.harness import float32_gb, peak_growth_of_variants, resident_gb, split_master_shapes  # noqa: E402
from trl_es.core.direction_optimizer import DirectionOptimizer, DirectionOptimizerSettings  # noqa: E402
from trl_es.core.sharded_master import ShardedMasterWeights  # noqa: E402
from trl_es.core.tensor_files import TensorFiles  # noqa: E402
from trl_es.core.update_shards import EngineShards  # noqa: E402

PROCESSES = 2
ADAM = {"es_optimizer": "adam", "es_optimizer_updates": 1}
READINGS = {"share": "share (TensorFiles)", "whole": "whole files (load_file)"}


def write_checkpoint(folder: Path, shapes: dict[str, tuple]) -> None:
    save_file({name: torch.full(shape, 0.5) for name, shape in shapes.items()}, folder / "master.safetensors")
    parts = ("exp_avg", "exp_avg_sq")
    state = {f"{name}.{part}": torch.full(shape, 0.1) for name, shape in shapes.items() for part in parts}
    save_file(state, folder / "optimizer.safetensors")


def resume(rank: int, world: int, folder: Path, shapes: dict[str, tuple], reading: str, results) -> None:
    parameters = {name: torch.zeros(shape, dtype=torch.bfloat16) for name, shape in shapes.items()}
    shards = EngineShards(dist.group.WORLD, {name: torch.Size(shape) for name, shape in shapes.items()})
    master = ShardedMasterWeights(parameters, 0.1, shards, device="cpu")
    master.optimizer = DirectionOptimizer(DirectionOptimizerSettings("adam"))
    Path("/proc/self/clear_refs").write_text("5")  # the peak starts again from the present size
    before = resident_gb("VmRSS")
    if reading == "share":
        masters, state = TensorFiles([folder / "master.safetensors"]), TensorFiles([folder / "optimizer.safetensors"])
    else:
        masters, state = load_file(folder / "master.safetensors"), load_file(folder / "optimizer.safetensors")
    master.load_saved(masters)
    master.restore_optimizer(state, ADAM)
    results[rank] = resident_gb("VmHWM") - before


def main():
    shapes = split_master_shapes(__doc__)
    master_gb = float32_gb(shapes)
    print(f"checkpoint: float32 master {master_gb:.2f} GB, adam state {2 * master_gb:.2f} GB; {PROCESSES} processes")
    print(f"{'reading':<28}{'peak growth per process (GB)':>32}")
    with tempfile.TemporaryDirectory(prefix="trl-es-resume-memory-") as folder:
        write_checkpoint(Path(folder), shapes)
        growth = peak_growth_of_variants(resume, PROCESSES, READINGS, Path(folder), shapes, widths=(28, 32))
    ratio = max(growth["share"]) / max(max(growth["whole"]), 1e-9)
    print(f"resume_share_memory_ratio (share / whole, the larger process of each): {ratio:.2f}")


if __name__ == "__main__":
    main()
