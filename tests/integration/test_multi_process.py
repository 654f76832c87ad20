"""Population-parallel ES: P processes split the members of every step and end with the 1-process weights, also
when they resume from a checkpoint."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from scripts.es_state_files import saved_es_state, saved_shares
from scripts.launch import launch
from scripts.paths import SCRIPTS

UNTIL_KILLED = SCRIPTS / "train_until_killed.py"


def needs_vllm():
    try:
        import vllm  # noqa: F401
    except ImportError:
        pytest.skip("vLLM is not installed")


@pytest.fixture(scope="module")
def one_process_runs(tiny_model_path, tmp_path_factory):
    """`(backend, *flags)` -> the folder of a 1-process run with them (run once, the first time a test asks)."""
    folders = {}

    def run(backend: str, *flags) -> Path:
        key = (backend, *flags)
        if key not in folders:
            folder = tmp_path_factory.mktemp(f"one-{backend}")
            one = launch(1, tiny_model_path, folder, *BACKEND_FLAGS[backend], *flags)
            assert one.returncode == 0, one.stderr[-3000:]
            folders[key] = folder
        return folders[key]

    return run


BACKEND_FLAGS = {"transformers": [], "vllm_colocate": ["--use_vllm"]}  # vLLM: one engine per process


def assert_same_run(one: Path, other: Path, files=("master.safetensors", "final.safetensors")):
    for file in files:
        single, double = load_file(one / file), load_file(other / file)
        assert single.keys() == double.keys()
        assert all(torch.equal(single[k], double[k]) for k in single), file
    assert torch.load(one / "rewards.pt") == torch.load(other / "rewards.pt")


@pytest.mark.slow
def test_two_processes_end_bitwise_identical_to_one(tmp_path, tiny_model_path, one_process_runs):
    two = launch(2, tiny_model_path, tmp_path / "two")
    assert two.returncode == 0, two.stderr[-3000:]
    assert (tmp_path / "two" / "num_processes").read_text() == "2"
    # The process group torn down, none of its threads is left to run while the interpreter exits (DeepSpeed,
    # imported by the Trainer, held it: `compat.deepspeed`).
    assert [(tmp_path / "two" / f"gloo_threads_rank{rank}").read_text() for rank in (0, 1)] == ["[]", "[]"]
    assert_same_run(one_process_runs("transformers"), tmp_path / "two")
    # No DDP: it would hold a gradient buffer the size of the evolving parameters that ES never fills.
    wrapped = {(tmp_path / "two" / f"wrapped_rank{rank}").read_text() for rank in range(2)}
    assert wrapped == {"Qwen2ForCausalLM"}


@pytest.mark.slow
def test_two_processes_with_an_engine_each_keep_one_model_and_end_and_resume_bitwise_as_one_process(
    tmp_path, tiny_model_path, one_process_runs
):
    """One colocated vLLM engine per process, a bf16 model: each process keeps the whole float32 master and writes
    every member into its own engine from it, so only the process that saves keeps the model's weights (the other
    gets them back from it when asked; coverage's entropies are measured by the first). The run, and its resume, in
    which the second process reads its master from the checkpoint and writes the centre into its engine from it, end
    bitwise as one process."""
    needs_vllm()
    settings = ["--dtype", "bfloat16", "--es_optimizer", "adam"]  # the one-process run the tensor-parallel test reads
    flags = ["--use_vllm", "--save_steps", 2, *settings]
    two = launch(2, tiny_model_path, tmp_path, *flags, "--evaluate")
    assert two.returncode == 0, two.stderr[-3000:]
    one = one_process_runs("vllm_colocate", *settings)
    assert_same_run(one, tmp_path)
    evaluation = json.loads((tmp_path / "eval.json").read_text())
    assert 0 <= evaluation["eval_reward"] <= 1 and evaluation["eval_entropy"] > 0
    total = sum(tensor.numel() for tensor in load_file(one / "master.safetensors").values())
    assert [int((tmp_path / f"master_elements_rank{rank}").read_text()) for rank in (0, 1)] == [total, total]
    model = [int((tmp_path / f"model_elements_rank{rank}").read_text()) for rank in (0, 1)]
    assert model == [total, 0], (model, total)
    assert [(tmp_path / f"given_back_rank{rank}").read_text() for rank in (0, 1)] == ["0", "0"]
    final = load_file(tmp_path / "final.safetensors")
    for rank in (0, 1):
        restored = load_file(tmp_path / f"restored_rank{rank}.safetensors")
        assert restored.keys() == final.keys() and all(torch.equal(restored[k], final[k]) for k in final)

    shutil.rmtree(tmp_path / "checkpoint-3")
    resumed = launch(2, tiny_model_path, tmp_path, *flags, "--resume_from", tmp_path / "checkpoint-2")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [(tmp_path / f"loaded_rank{rank}").read_text() for rank in (0, 1)] == ["True", "False"]
    assert_same_run(one, tmp_path)


@pytest.mark.slow
def test_two_processes_sharing_a_tensor_parallel_engine_split_the_master_keep_one_model_and_end_bitwise_as_one_process(
    tmp_path, tiny_model_path, one_process_runs
):
    """vllm_tensor_parallel_size=2 on a bf16 model: the two processes are one evaluator (they load the same members
    into the engine they share, each writing whole tensors that vLLM shards; the tiny model has fewer KV heads than
    ranks, so the shards also hold replicated parts), each keeps about half of the float32 master, only the one that
    saves keeps the model's weights (the other gets them back from it when asked), each writes its share of the master
    (and the adam state) whole: the run and its resume, on the same layout or on one process, end bitwise as one
    process with its own engine."""
    needs_vllm()
    settings = ["--dtype", "bfloat16", "--es_optimizer", "adam"]  # adam: its state is split and gathered too
    flags = ["--use_vllm", "--tensor_parallel_size", 2, "--save_steps", 2, *settings]
    shared = launch(2, tiny_model_path, tmp_path, *flags, "--evaluate")
    assert shared.returncode == 0, shared.stderr[-3000:]
    one = one_process_runs("vllm_colocate", *settings)
    assert_same_run(one, tmp_path)
    # Evaluation gives each process rows of its own: the engine generates everyone's, each keeps its own.
    assert [(tmp_path / f"rank_rows_rank{rank}").read_text() for rank in (0, 1)] == ["True", "True"]
    evaluation = json.loads((tmp_path / "eval.json").read_text())
    assert 0 <= evaluation["eval_reward"] <= 1 and evaluation["eval_entropy"] > 0  # coverage ran the model
    total = sum(tensor.numel() for tensor in load_file(one / "master.safetensors").values())
    held = [int((tmp_path / f"master_elements_rank{rank}").read_text()) for rank in (0, 1)]
    assert sum(held) == total and max(held) < 0.6 * total, (held, total)
    # The process that saves keeps the model, following the centre; the other released its copy (coverage's entropies
    # were measured by the first, as the second had no weights to run) and gets it back from the first when asked.
    model = [int((tmp_path / f"model_elements_rank{rank}").read_text()) for rank in (0, 1)]
    assert model == [total, 0], (model, total)
    assert [(tmp_path / f"given_back_rank{rank}").read_text() for rank in (0, 1)] == ["0", "0"]  # not even for that
    final = load_file(tmp_path / "final.safetensors")
    for rank in (0, 1):
        restored = load_file(tmp_path / f"restored_rank{rank}.safetensors")
        assert restored.keys() == final.keys() and all(torch.equal(restored[k], final[k]) for k in final)

    # The bf16 weights' masters and their adam state: each process wrote the share it owns, about half
    shares = saved_shares(tmp_path / "checkpoint-2")
    assert list(shares) == ["master.safetensors", "master-rank-1.safetensors"]
    assert max(sum(t.numel() for t in share.values()) for share in shares.values()) < 0.6 * total
    saved = saved_es_state(tmp_path / "checkpoint-2")
    assert sum(tensor.numel() for tensor in saved.values()) == total
    adam = saved_es_state(tmp_path / "checkpoint-2", "optimizer")
    assert sum(tensor.numel() for tensor in adam.values()) == 2 * total  # both moments of every tensor
    shutil.rmtree(tmp_path / "checkpoint-3")
    resumed = launch(2, tiny_model_path, tmp_path, *flags, "--resume_from", tmp_path / "checkpoint-2")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_run(one, tmp_path, files=("master.safetensors",))
    # The process that releases the model does not load the checkpoint's weights: it reads its master share.
    assert [(tmp_path / f"loaded_rank{rank}").read_text() for rank in (0, 1)] == ["True", "False"]
    # Another layout resumes it too: one process with an engine of its own reads both shares
    alone = tmp_path / "resumed-alone"
    resumed = launch(1, tiny_model_path, alone, "--use_vllm", *settings, "--resume_from", tmp_path / "checkpoint-2")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (alone / "loaded_rank0").read_text() == "True"
    assert_same_run(one, alone, files=("master.safetensors",))


@pytest.mark.slow
def test_a_float32_tensor_parallel_run_resumes_each_share_of_its_master_from_the_model_files(
    tmp_path, tiny_model_path, one_process_runs
):
    """A float32 model's checkpoint keeps no ES master (its weights are the master): the process that keeps no model
    reads its share from the checkpoint's model files instead of loading them, and the resumed run ends bitwise as
    the one-process run."""
    needs_vllm()
    flags = ["--use_vllm", "--tensor_parallel_size", 2, "--save_steps", 2]
    shared = launch(2, tiny_model_path, tmp_path, *flags)
    assert shared.returncode == 0, shared.stderr[-3000:]
    assert saved_es_state(tmp_path / "checkpoint-2") == {}
    shutil.rmtree(tmp_path / "checkpoint-3")
    resumed = launch(2, tiny_model_path, tmp_path, *flags, "--resume_from", tmp_path / "checkpoint-2")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [(tmp_path / f"loaded_rank{rank}").read_text() for rank in (0, 1)] == ["True", "False"]
    assert_same_run(one_process_runs("vllm_colocate"), tmp_path, files=("master.safetensors",))


@pytest.mark.slow
def test_a_tensor_parallel_run_loads_its_best_checkpoint_only_where_the_model_is_kept(tmp_path, tiny_model_path):
    """load_best_model_at_end where the process that saves no checkpoint released the model's weights: as on resume,
    the Trainer loads the best checkpoint into the process that saves, the other keeps its weights released (its
    population reads its master share from the checkpoint), and every process holds the best checkpoint's weights
    once they are given back."""
    needs_vllm()
    run = launch(2, tiny_model_path, tmp_path, "--use_vllm", "--tensor_parallel_size", 2, "--dtype", "bfloat16",
                 "--load_best")  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    state = json.loads((tmp_path / "checkpoint-3" / "trainer_state.json").read_text())
    assert state["best_model_checkpoint"] != str(tmp_path / "checkpoint-3")  # the best is not the last weights
    best = load_file(Path(state["best_model_checkpoint"]) / "model.safetensors")
    total = sum(tensor.numel() for tensor in load_file(tmp_path / "master.safetensors").values())
    trained = [int((tmp_path / f"trained_model_elements_rank{rank}").read_text()) for rank in (0, 1)]
    assert trained == [total, 0], (trained, total)
    # Nor does the population built again from the best checkpoint give them back: it reads the masters from it.
    assert [(tmp_path / f"given_back_rank{rank}").read_text() for rank in (0, 1)] == ["0", "0"]
    for rank in (0, 1):
        restored = load_file(tmp_path / f"restored_rank{rank}.safetensors")
        assert all(torch.equal(restored[name], best[name]) for name in restored), rank
    master = load_file(tmp_path / "master.safetensors")  # gathered from both shares, each read from the best
    saved = saved_es_state(Path(state["best_model_checkpoint"]))
    assert master.keys() == saved.keys() and all(torch.equal(master[name], saved[name]) for name in saved)


@pytest.mark.slow
def test_two_processes_shard_the_adam_state_save_it_whole_and_resume_bitwise(tmp_path, tiny_model_path):
    """With shard_update each process keeps the es_optimizer state of the tensors it owns only (about half here); a
    checkpoint still holds all of it, bitwise the 1-process run's, and a resume on 2 processes or on 1 ends as the
    1-process run."""
    adam = ["--es_optimizer", "adam", "--save_steps", "2"]
    one = launch(1, tiny_model_path, tmp_path / "one", *adam)
    assert one.returncode == 0, one.stderr[-3000:]
    two = launch(2, tiny_model_path, tmp_path / "two", *adam)
    assert two.returncode == 0, two.stderr[-3000:]
    total = int((tmp_path / "one" / "optimizer_elements_rank0").read_text())
    held = [int((tmp_path / "two" / f"optimizer_elements_rank{rank}").read_text()) for rank in (0, 1)]
    assert sum(held) == total and max(held) < 0.75 * total, (held, total)
    single, double = (saved_es_state(tmp_path / run / "checkpoint-2", "optimizer") for run in ("one", "two"))
    assert single.keys() == double.keys() and all(torch.equal(single[k], double[k]) for k in single)
    # each process wrote the state of the tensors it owns, where one gathered all of it before
    shares = saved_shares(tmp_path / "two" / "checkpoint-2", "optimizer")
    assert [sum(t.numel() for t in share.values()) for share in shares.values()] == held
    assert sum(t.numel() for t in single.values()) == total

    # The checkpoint resumes on any number of processes: on 2 (each reads the state of the tensors it owns) and on 1
    # (it reads both shares), each ending as the run that was not stopped
    uninterrupted = load_file(tmp_path / "one" / "master.safetensors")
    for processes in (2, 1):
        resumed_dir = tmp_path / f"resumed-on-{processes}"
        resumed = launch(
            processes, tiny_model_path, resumed_dir, *adam, "--resume_from", tmp_path / "two" / "checkpoint-2"
        )
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        loaded = [(resumed_dir / f"loaded_rank{rank}").read_text() for rank in range(processes)]
        assert loaded == ["True"] * processes  # each began from the checkpoint's weights, not the model's
        again = load_file(resumed_dir / "master.safetensors")
        assert again.keys() == uninterrupted.keys(), processes
        assert all(torch.equal(uninterrupted[k], again[k]) for k in again), processes


@pytest.mark.slow
def test_two_processes_resume_bitwise_from_a_checkpoint_in_the_middle_of_an_epoch(tmp_path, tiny_model_path):
    """8 prompts, 4 a step: checkpoint-3 is halfway through epoch 1, so the resume skips that epoch's first batch
    and must replay epoch 1's shuffle (skipping wraps the sharded sampler once more, past accelerate's set_epoch)."""
    flags = ["--save-steps", 3]
    whole = launch(2, tiny_model_path, tmp_path, *flags, script=UNTIL_KILLED)
    assert whole.returncode == 0, whole.stderr[-3000:]
    uninterrupted = load_file(tmp_path / "final" / "model.safetensors")
    assert json.loads((tmp_path / "checkpoint-3" / "trainer_state.json").read_text())["epoch"] == 1.5
    for later in ("checkpoint-6", "final"):
        shutil.rmtree(tmp_path / later)

    resumed = launch(2, tiny_model_path, tmp_path, *flags, "--resume", script=UNTIL_KILLED)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    weights = load_file(tmp_path / "final" / "model.safetensors")
    assert weights.keys() == uninterrupted.keys()
    assert all(torch.equal(weights[k], uninterrupted[k]) for k in weights)


@pytest.mark.slow
def test_ranks_that_diverge_fail_naming_the_step(tmp_path, tiny_model_path):
    run = launch(2, tiny_model_path, tmp_path / "corrupt", "--corrupt_rank", 1)
    assert run.returncode != 0
    assert "At step 2 the processes' ES masters disagree" in run.stdout + run.stderr


@pytest.mark.slow
def test_ranks_that_start_from_different_weights_fail_before_the_first_step(tmp_path, tiny_model_path):
    """No DistributedDataParallel copies rank 0's weights to the others, so the masters are compared as soon as they
    are built (the message of step 0), not one step of different members later."""
    run = launch(2, tiny_model_path, tmp_path / "apart", "--start_apart_rank", 1)
    assert run.returncode != 0
    assert "The processes start from different weights" in run.stdout + run.stderr
    assert "At step 1" not in run.stdout + run.stderr


DEEPSPEED_SCRIPT = SCRIPTS / "train_under_deepspeed.py"


@pytest.mark.slow
@pytest.mark.parametrize("config", ["deepspeed_zero2.yaml", "deepspeed_zero3.yaml"])
def test_grpo_stages_train_under_deepspeed_with_our_configs(tmp_path, tiny_model_path, config):
    pytest.importorskip("deepspeed")
    run = launch(2, tiny_model_path, tmp_path / "grpo", "grpo", script=DEEPSPEED_SCRIPT, config=config)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "TRAINED grpo steps=1 processes=2" in run.stdout
    if config == "deepspeed_zero2.yaml":  # ZeRO-3's partitioned parameters still hold its groups (not released)
        assert run.stdout.count("GLOO THREADS LEFT []") == 2


@pytest.mark.slow
def test_es_under_deepspeed_is_refused_with_the_alternative(tmp_path, tiny_model_path):
    pytest.importorskip("deepspeed")
    run = launch(2, tiny_model_path, tmp_path / "es", "es", script=DEEPSPEED_SCRIPT, config="deepspeed_zero2.yaml")
    assert run.returncode != 0
    assert "ESTrainer does not run under DeepSpeed" in run.stderr and "multi_gpu.yaml" in run.stderr
