"""Population-parallel ES: P processes split the members of every step and end with the 1-process weights."""

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from trl_es.core.distributed import check_population_divides, members_of_this_process
from trl_es.core.noise import population

SCRIPT = Path(__file__).parent / "scripts" / "train_population.py"


CONFIGS = Path(__file__).parents[1] / "examples" / "accelerate_configs"


def launch(processes: int, *args, script=SCRIPT, config=None) -> subprocess.CompletedProcess:
    """`accelerate launch` with one of our configs. The scripts set `use_cpu=True`, so on a machine without GPUs the
    processes of multi_gpu.yaml become CPU ranks talking over gloo (accelerate's own `--cpu --num_processes 2`
    starts a single process unless mpirun is set up)."""
    config = config or ("single_gpu.yaml" if processes == 1 else "multi_gpu.yaml")
    accelerate = Path(sys.executable).with_name("accelerate")
    command = [str(accelerate), "launch", "--config_file", str(CONFIGS / config), "--num_processes", str(processes)]
    return subprocess.run([*command, str(script), *map(str, args)], capture_output=True, text=True, timeout=600)


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


DEEPSPEED_SCRIPT = Path(__file__).parent / "scripts" / "train_under_deepspeed.py"


@pytest.mark.slow
@pytest.mark.parametrize("config", ["deepspeed_zero2.yaml", "deepspeed_zero3.yaml"])
def test_grpo_stages_train_under_deepspeed_with_our_configs(tmp_path, tiny_model_path, config):
    pytest.importorskip("deepspeed")
    run = launch(2, tiny_model_path, tmp_path / "grpo", "grpo", script=DEEPSPEED_SCRIPT, config=config)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "TRAINED grpo steps=1 processes=2" in run.stdout


@pytest.mark.slow
def test_es_under_deepspeed_is_refused_with_the_alternative(tmp_path, tiny_model_path):
    pytest.importorskip("deepspeed")
    run = launch(2, tiny_model_path, tmp_path / "es", "es", script=DEEPSPEED_SCRIPT, config="deepspeed_zero2.yaml")
    assert run.returncode != 0
    assert "ESTrainer does not run under DeepSpeed" in run.stderr and "multi_gpu.yaml" in run.stderr
