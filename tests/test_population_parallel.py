"""Population-parallel ES: P processes split the members of every step and end with the 1-process weights."""

import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from trl_es.distributed import check_population_divides, members_of_this_process
from trl_es.noise import population

SCRIPT = Path(__file__).parent / "scripts" / "train_population.py"


def launch(processes: int, *args) -> subprocess.CompletedProcess:
    # `--multi_gpu` makes accelerate start the processes with torch.distributed; the script's `use_cpu=True` turns
    # them into CPU ranks talking over gloo. (`--cpu --num_processes 2` starts one process without mpirun.)
    accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or "accelerate"
    command = [accelerate, "launch", "--multi_gpu", "--num_processes", str(processes), str(SCRIPT), *map(str, args)]
    if processes == 1:
        command = [sys.executable, str(SCRIPT), *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


def test_members_are_dealt_round_robin():
    members = population(0, step=0, population_size=6)
    shares = [members_of_this_process(SimpleNamespace(process_index=r, num_processes=3), members) for r in range(3)]
    assert shares == [members[0::3], members[1::3], members[2::3]]
    rounds = [share[j] for j in range(2) for share in shares]  # round j gathers members jP .. jP + P - 1
    assert rounds == members


def test_population_must_divide_among_processes():
    check_population_divides(30, 3)
    with pytest.raises(
        ValueError, match=r"population_size \(30\) must be a multiple of the number of processes \(4\)"
    ):
        check_population_divides(30, 4)


def needs_vllm():
    try:
        import vllm  # noqa: F401
    except ImportError:
        pytest.skip("vLLM is not installed")


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["transformers", "vllm_colocate"])
def test_two_processes_end_bitwise_identical_to_one(tmp_path, tiny_model_path, backend):
    flags = []
    if backend == "vllm_colocate":
        needs_vllm()
        flags = ["--use_vllm"]  # one engine per process
    one = launch(1, tiny_model_path, tmp_path / "one", *flags)
    assert one.returncode == 0, one.stderr[-3000:]
    two = launch(2, tiny_model_path, tmp_path / "two", *flags)
    assert two.returncode == 0, two.stderr[-3000:]
    assert (tmp_path / "two" / "num_processes").read_text() == "2"
    for file in ("master.safetensors", "final.safetensors"):
        single, double = load_file(tmp_path / "one" / file), load_file(tmp_path / "two" / file)
        assert single.keys() == double.keys()
        assert all(torch.equal(single[k], double[k]) for k in single), file
    assert torch.load(tmp_path / "one" / "rewards.pt") == torch.load(tmp_path / "two" / "rewards.pt")


@pytest.mark.slow
def test_ranks_that_diverge_fail_naming_the_step(tmp_path, tiny_model_path):
    run = launch(2, tiny_model_path, tmp_path / "corrupt", "--corrupt_rank", 1)
    assert run.returncode != 0
    assert "At step 2 the processes' ES masters disagree" in run.stdout + run.stderr
