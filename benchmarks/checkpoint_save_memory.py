"""What the process that saves adds to its memory while it writes a checkpoint's ES state from a split master.

Two gloo processes split a float32 master (each owns half of the tensors) with its adam state, as the processes of a
tensor-parallel engine or of a server run do; process 0 saves. Each process resets its peak resident size
(`/proc/self/clear_refs`), writes or sends its part of the checkpoint's ES state, and reports how far the peak rose
(`VmHWM - VmRSS` before), three ways side by side in one run: as trl-es writes it where one process saves (each owner
writes its own share, one tensor at a time: `save_es_state_shares`), as it writes it where several save
(`save_on_each_node`: each tensor sent from its owner when the writer asks for it, written and let go of:
`save_es_state`), and gathered whole first (the master and the adam state collected, the starting weights read whole,
then `save_file`, as the process that saves did before 2026-12-06):

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
from trl_es.core.checkpoint import ES_STATE_DIR, save_es_state, save_es_state_shares  # noqa: E402
from trl_es.core.direction_optimizer import DirectionOptimizer, DirectionOptimizerSettings  # noqa: E402
from trl_es.core.sharded_master import ShardedMasterWeights  # noqa: E402
from trl_es.core.tensor_files import drain  # noqa: E402
from trl_es.core.update_shards import EngineShards  # noqa: E402
from trl_es.evaluation.metrics import StartingWeights  # noqa: E402

PROCESSES = 2
WRITINGS = {
    "shares": "each owner its share (trl-es)",
    "streamed": "sent one at a time (on each node)",
    "gathered": "gathered whole, then saved",
}


def save(rank: int, world: int, folder: Path, shapes: dict[str, tuple], writing: str, results) -> None:
    master, reference = split_master(rank, shapes)
    Path("/proc/self/clear_refs").write_text("5")  # the peak starts again from the present size
    before = resident_gb("VmRSS")
    write(rank, master, reference, folder / writing, writing)
    results[rank] = resident_gb("VmHWM") - before


def split_master(rank: int, shapes: dict[str, tuple]) -> tuple[ShardedMasterWeights, StartingWeights | None]:
    """A float32 master of `shapes` split between the processes, after one adam update (its state exists from the
    first), and, on process 0, the starting weights in a file."""
    parameters = {name: torch.full(shape, 0.5, dtype=torch.bfloat16) for name, shape in shapes.items()}
    shards = EngineShards(dist.group.WORLD, {name: torch.Size(shape) for name, shape in shapes.items()})
    master = ShardedMasterWeights(parameters, 0.1, shards, device="cpu")
    master.optimizer = DirectionOptimizer(DirectionOptimizerSettings("adam"))
    master.apply_update({1: 1.0}, lr=1e-3)
    # The bf16 parameters go with this call: the trainer's model, in memory before and after a save alike
    return master, StartingWeights.write(parameters) if rank == 0 else None


def write(rank: int, master: ShardedMasterWeights, reference: StartingWeights | None, output: Path, writing: str):
    """Write (or send) this process's part of the ES state into `output` in one of the `WRITINGS`; process 0 saves."""
    own = writing == "shares"
    masters = master.checkpoint_stream(master.names(), keep=rank == 0, own=own)
    optimizer_state = master.optimizer_stream(keep=rank == 0, own=own)
    if own:
        saver = dict(reference=reference, metadata={"global_step": 1}) if rank == 0 else {}
        save_es_state_shares(output, rank, masters, optimizer_state, master.shards.all_gather, **saver)
    elif rank != 0:
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


def main():
    shapes = split_master_shapes(__doc__)
    master_gb = float32_gb(shapes)
    print(f"ES state: float32 master {master_gb:.2f} GB, adam state {2 * master_gb:.2f} GB; {PROCESSES} processes")
    print(f"{'writing':<34}{'peak growth (GB): saves, other':>34}")
    with tempfile.TemporaryDirectory(prefix="trl-es-save-memory-") as folder:
        growth = peak_growth_of_variants(save, PROCESSES, WRITINGS, Path(folder), shapes, widths=(34, 34))
    gathered = max(growth["gathered"][0], 1e-9)
    streamed = growth["streamed"][0] / gathered
    print(f"checkpoint_save_memory_ratio_streamed (sent / gathered, the process that saves): {streamed:.2f}")
    ratio = growth["shares"][0] / gathered
    print(f"checkpoint_save_memory_ratio (each owner its share / gathered, the process that saves): {ratio:.2f}")


if __name__ == "__main__":
    main()
