"""Many machines: ES launched as two "machines" with examples/accelerate_configs/multi_node.yaml, each machine an
`accelerate launch --num_machines 2 --machine_rank R --main_process_ip 127.0.0.1` of its own, talking over loopback
TCP (gloo ranks: tests/scripts/train_population.py sets `use_cpu=True`), ends bitwise equal to one process."""

import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from scripts.paths import ACCELERATE_CONFIGS, SCRIPTS

from benchmarks.harness import free_port

SCRIPT = SCRIPTS / "train_population.py"
MULTI_NODE = ACCELERATE_CONFIGS / "multi_node.yaml"


def launch_machines(model: str, output_dir: Path, processes_per_machine: int) -> list[subprocess.CompletedProcess]:
    """Start machine 0 and machine 1 at once, as one would on two hosts, and wait for both."""
    accelerate = Path(sys.executable).with_name("accelerate")
    port = free_port()
    machines = []
    for rank in (0, 1):
        command = [
            str(accelerate), "launch", "--config_file", str(MULTI_NODE),
            "--num_machines", "2", "--machine_rank", str(rank), "--num_processes", str(2 * processes_per_machine),
            "--main_process_ip", "127.0.0.1", "--main_process_port", str(port),
            str(SCRIPT), model, str(output_dir),
        ]  # fmt: skip
        machines.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        outputs = [machine.communicate(timeout=600)[0] for machine in machines]
    finally:
        for machine in machines:
            machine.kill()  # a machine whose peer died waits for it at the rendezvous
    return [subprocess.CompletedProcess(m.args, m.returncode, out) for m, out in zip(machines, outputs, strict=True)]


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
    for rank, machine in enumerate(machines):
        assert machine.returncode == 0, f"machine {rank}:\n{machine.stdout[-3000:]}"
    assert (tmp_path / "two-machines" / "num_processes").read_text() == str(2 * processes_per_machine)
    for file in ("master.safetensors", "final.safetensors"):
        single, multi = load_file(one_process / file), load_file(tmp_path / "two-machines" / file)
        assert single.keys() == multi.keys()
        assert all(torch.equal(single[name], multi[name]) for name in single), file
    assert torch.load(one_process / "rewards.pt") == torch.load(tmp_path / "two-machines" / "rewards.pt")
