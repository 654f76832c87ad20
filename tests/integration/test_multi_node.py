"""Many machines: ES launched as two "machines" with examples/accelerate_configs/multi_node.yaml, each machine an
`accelerate launch --num_machines 2 --machine_rank R --main_process_ip 127.0.0.1` of its own, talking over loopback
TCP (gloo ranks: tests/scripts/train_population.py sets `use_cpu=True`), ends bitwise equal to one process; and with
`save_on_each_node`, each machine writes a whole checkpoint to its own disk and resumes from it."""

import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from scripts.es_state_files import saved_shares
from scripts.paths import ACCELERATE_CONFIGS, SCRIPTS

from benchmarks.harness import ACCELERATE_LAUNCH, free_port

SCRIPT = SCRIPTS / "train_population.py"
MULTI_NODE = ACCELERATE_CONFIGS / "multi_node.yaml"


def launch_machines(
    model: str, output_dir: Path, processes_per_machine: int, *flags: str, disks: bool = False
) -> list[subprocess.CompletedProcess]:
    """Start machine 0 and machine 1 at once, as one would on two hosts, and wait for both. With `disks`, each machine
    writes to a folder of its own, `output_dir/machine<R>` (as to its own disk)."""
    port = free_port()
    machines = []
    for rank in (0, 1):
        folder = output_dir / f"machine{rank}" if disks else output_dir
        command = [
            *ACCELERATE_LAUNCH, "--config_file", str(MULTI_NODE),
            "--num_machines", "2", "--machine_rank", str(rank), "--num_processes", str(2 * processes_per_machine),
            "--main_process_ip", "127.0.0.1", "--main_process_port", str(port),
            str(SCRIPT), model, str(folder), *[flag.replace("{output_dir}", str(folder)) for flag in flags],
        ]  # fmt: skip
        machines.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        outputs = [machine.communicate(timeout=600)[0] for machine in machines]
    finally:
        for machine in machines:
            machine.kill()  # a machine whose peer died waits for it at the rendezvous
    return [subprocess.CompletedProcess(m.args, m.returncode, out) for m, out in zip(machines, outputs, strict=True)]


def assert_succeeded(machines: list[subprocess.CompletedProcess]) -> None:
    """Every machine exited 0; otherwise the end of each failed machine's output (the first to fail may be either)."""
    failed = [f"machine {rank}:\n{m.stdout[-3000:]}" for rank, m in enumerate(machines) if m.returncode != 0]
    assert not failed, "\n".join(failed)


@pytest.fixture(scope="module")
def one_process(tiny_model_path, tmp_path_factory):
    """The same script, run in this process: the single-process reference."""
    output_dir = tmp_path_factory.mktemp("one-process")
    argv, path = sys.argv, list(sys.path)
    sys.argv, sys.path = [str(SCRIPT), tiny_model_path, str(output_dir)], [str(SCRIPTS), *sys.path]
    try:
        runpy.run_path(str(SCRIPT), run_name="__main__")
    finally:
        sys.argv, sys.path[:] = argv, path
    return output_dir


@pytest.mark.slow
@pytest.mark.parametrize("processes_per_machine", [1, 2])
def test_two_machines_over_loopback_end_bitwise_identical_to_one_process(
    one_process, tiny_model_path, tmp_path, processes_per_machine
):
    machines = launch_machines(tiny_model_path, tmp_path / "two-machines", processes_per_machine)
    assert_succeeded(machines)
    assert (tmp_path / "two-machines" / "num_processes").read_text() == str(2 * processes_per_machine)
    for file in ("master.safetensors", "final.safetensors"):
        single, multi = load_file(one_process / file), load_file(tmp_path / "two-machines" / file)
        assert single.keys() == multi.keys()
        assert all(torch.equal(single[name], multi[name]) for name in single), file
    assert torch.load(one_process / "rewards.pt") == torch.load(tmp_path / "two-machines" / "rewards.pt")


@pytest.mark.slow
def test_with_a_saver_on_each_machine_each_disk_gets_the_whole_es_state_and_each_machine_resumes_from_its_own(
    tiny_model_path, tmp_path
):
    """`save_on_each_node=True`: the main process of each machine saves, to its own disk. With `shard_update` each
    process keeps the adam state of the tensors it owns, so each share must reach both savers: both checkpoints hold
    all of it, bitwise alike, and both machines resuming from their own disk end as the run that was not stopped;
    disks whose copies differ are refused, naming the checkpoint."""
    flags = ["--es_optimizer", "adam", "--save_steps", "2", "--save_on_each_node"]
    whole = launch_machines(tiny_model_path, tmp_path / "whole", 1, *flags, disks=True)
    assert_succeeded(whole)
    disks = [tmp_path / "whole" / f"machine{rank}" for rank in (0, 1)]
    held = [int((disk / f"optimizer_elements_rank{rank}").read_text()) for rank, disk in enumerate(disks)]
    assert min(held) > 0  # the state was split between the machines
    states = []
    for disk in disks:
        shares = {kind: saved_shares(disk / "checkpoint-2", kind) for kind in ("master", "optimizer")}
        assert [list(files) for files in shares.values()] == [["master.safetensors"], ["optimizer.safetensors"]]
        states.append({kind: next(iter(files.values())) for kind, files in shares.items()})
    assert sum(tensor.numel() for tensor in states[0]["optimizer"].values()) == sum(held)
    for kind in ("master", "optimizer"):
        first, second = states[0][kind], states[1][kind]
        assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first), kind

    uninterrupted = load_file(disks[0] / "master.safetensors")

    resume = ["--resume_from", "{output_dir}/checkpoint-2"]  # each machine reads its own disk
    resumed = launch_machines(tiny_model_path, tmp_path / "whole", 1, *flags, *resume, disks=True)
    assert_succeeded(resumed)
    assert [(disk / f"loaded_rank{rank}").read_text() for rank, disk in enumerate(disks)] == ["True", "True"]
    again = load_file(disks[0] / "master.safetensors")
    assert again.keys() == uninterrupted.keys() and all(torch.equal(again[k], uninterrupted[k]) for k in again)

    # Copies that differ (one disk holding another checkpoint of the same name): refused before the first step, naming
    # the checkpoint, where the message said to build the model the same on every process
    weights_file = disks[1] / "checkpoint-2" / "model.safetensors"
    weights = load_file(weights_file)
    name = next(name for name in weights if name.endswith("q_proj.weight"))
    weights[name].view(-1)[0] += 1e-3
    save_file(weights, weights_file, metadata={"format": "pt"})
    apart = launch_machines(tiny_model_path, tmp_path / "whole", 1, *flags, *resume, disks=True)
    assert all(machine.returncode != 0 for machine in apart)
    output = apart[0].stdout + apart[1].stdout
    assert "The processes resumed from" in output and "with different weights" in output, output[-3000:]
