"""A run killed with SIGKILL (kill -9) mid-step, an ES run or an EVOLM run mid-phase, resumes from its last checkpoint
and ends with the uninterrupted weights. A run preempted with SIGTERM or SIGUSR1 mid-step (one process, one rank of
two, or the `accelerate launch` process that forwards it to every rank) stops after that step with a checkpoint,
exits with 128 + the signal, and resumes to the uninterrupted weights; so does a preempted GRPO stage of a
SequentialTrainer."""

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from scripts.fast_es import fast_grpo_config
from scripts.launch import launch
from scripts.paths import SCRIPTS

from trl_es import SequentialTrainer
from trl_es.core.checkpoint import checkpoint_problem
from trl_es.testing import digit_fraction, digit_prompts
from trl_es.trainer.output_lock import LOCK_FILE
from trl_es.trainer.preemption import TrainingPreempted

SCRIPT = SCRIPTS / "train_until_killed.py"


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def uninterrupted(tiny_model_path, tmp_path_factory):
    """The final weights of the script's run (6 steps, 4 prompts each), never interrupted."""
    output_dir = tmp_path_factory.mktemp("uninterrupted")
    clean = run(tiny_model_path, output_dir)
    assert clean.returncode == 0, clean.stderr[-2000:]
    return load_file(output_dir / "final" / "model.safetensors")


def assert_bitwise_equal(weights, expected):
    assert weights.keys() == expected.keys()
    assert all(torch.equal(weights[k], expected[k]) for k in expected)


def checkpoint_names(output_dir):
    return sorted(path.name for path in Path(output_dir).glob("checkpoint-*"))


@pytest.mark.slow
def test_sigkill_mid_training_then_resume_matches_an_uninterrupted_run(tmp_path, tiny_model_path, uninterrupted):
    killed_dir = tmp_path / "killed"
    # 4 members per step: reward call 19 is the third member of step 5, after checkpoint-4 was written.
    killed = run(tiny_model_path, killed_dir, "--kill-at-reward-call", 19)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert checkpoint_names(killed_dir) == ["checkpoint-2", "checkpoint-4"]
    assert not (killed_dir / "final").exists()

    resumed = run(tiny_model_path, killed_dir, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert_bitwise_equal(load_file(killed_dir / "final" / "model.safetensors"), uninterrupted)


@pytest.mark.slow
def test_sigterm_mid_step_exits_143_with_a_checkpoint_that_resumes_to_the_uninterrupted_weights(
    tmp_path, tiny_model_path, uninterrupted
):
    # 4 members per step: reward call 11 is the third member of step 3, between the checkpoints of steps 2 and 4.
    preempted = run(tiny_model_path, tmp_path, "--signal", "TERM", "--signal-at-reward-call", 11)
    assert preempted.returncode == 143, preempted.stderr[-2000:]
    assert "Traceback" not in preempted.stderr
    stopped = f"Received SIGTERM during step 3: training stopped after that step and saved the checkpoint {tmp_path}"
    assert f"{stopped}/checkpoint-3." in preempted.stderr
    assert "resume_from_checkpoint=True" in preempted.stderr and "Exiting with status 143" in preempted.stderr
    assert checkpoint_names(tmp_path) == ["checkpoint-2", "checkpoint-3"]
    assert checkpoint_problem(tmp_path / "checkpoint-3") is None
    assert (tmp_path / "stopped_rank0").read_text() == "3"
    assert not (tmp_path / LOCK_FILE).exists() and not (tmp_path / "final").exists()

    resumed = run(tiny_model_path, tmp_path, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert_bitwise_equal(load_file(tmp_path / "final" / "model.safetensors"), uninterrupted)


@pytest.mark.slow
def test_sigusr1_mid_step_exits_138_with_a_complete_checkpoint(tmp_path, tiny_model_path):
    preempted = run(tiny_model_path, tmp_path, "--signal", "USR1", "--signal-at-reward-call", 11)
    assert preempted.returncode == 138, preempted.stderr[-2000:]
    assert "Received SIGUSR1 during step 3: training stopped after that step" in preempted.stderr
    assert checkpoint_names(tmp_path) == ["checkpoint-2", "checkpoint-3"]
    assert checkpoint_problem(tmp_path / "checkpoint-3") is None


@pytest.mark.slow
def test_sigterm_to_one_rank_stops_both_after_the_same_step_and_the_checkpoint_resumes(
    tmp_path, tiny_model_path, uninterrupted
):
    # 2 processes of 2 members each: rank 1's reward call 5 is in step 3; rank 0 never receives the signal. Step 3 is
    # halfway through epoch 1 (8 prompts, 4 a step), so the resume replays that epoch's shuffle on both processes.
    # save_steps=5: the only checkpoint is the one the signal made.
    flags = ["--save-steps", 5, "--signal", "TERM", "--signal-at-reward-call", 5, "--signal-rank", 1]
    preempted = launch(2, tiny_model_path, tmp_path, *flags, script=SCRIPT)
    assert preempted.returncode != 0  # accelerate launch reports the ranks' 143 and exits with 1
    assert "exitcode  : 143" in preempted.stderr, preempted.stderr[-3000:]
    assert [(tmp_path / f"stopped_rank{rank}").read_text() for rank in (0, 1)] == ["3", "3"]
    assert "Received SIGTERM on process 1 of 2 during step 3" in preempted.stderr
    assert checkpoint_names(tmp_path) == ["checkpoint-3"]
    assert checkpoint_problem(tmp_path / "checkpoint-3") is None
    assert not (tmp_path / LOCK_FILE).exists()

    resumed = launch(2, tiny_model_path, tmp_path, "--save-steps", 5, "--resume", script=SCRIPT)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_bitwise_equal(load_file(tmp_path / "final" / "model.safetensors"), uninterrupted)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "status"), [("TERM", 143), ("USR1", 138)])
def test_a_signal_to_accelerate_launch_stops_every_rank_after_the_same_step(
    tmp_path, tiny_model_path, monkeypatch, name, status
):
    """The launcher forwards SIGTERM to the ranks; SIGUSR1 (SLURM's early warning) only once told to, with
    PET_SIGNALS_TO_HANDLE (torchrun's `--signals_to_handle`): otherwise SIGUSR1 ends the launcher itself."""
    monkeypatch.setenv("PET_SIGNALS_TO_HANDLE", "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1")
    flags = ["--signal", name, "--signal-at-reward-call", 5, "--signal-the-launcher"]
    preempted = launch(2, tiny_model_path, tmp_path, *flags, script=SCRIPT)
    assert preempted.returncode == status, preempted.stderr[-3000:]
    assert f"Received SIG{name} on every process during step 3" in preempted.stderr
    assert [(tmp_path / f"stopped_rank{rank}").read_text() for rank in (0, 1)] == ["3", "3"]
    assert checkpoint_problem(tmp_path / "checkpoint-3") is None


def test_a_preempted_grpo_stage_of_a_sequence_resumes_when_the_sequence_trains_again(tmp_path, tiny_model_path):
    calls = {"count": 0, "signal_at": 3}  # GRPO scores one batch per step: call 3 is step 3

    def digit_reward(completions, **kwargs):
        calls["count"] += 1
        if calls["count"] == calls["signal_at"]:
            signal.raise_signal(signal.SIGTERM)
        return digit_fraction(completions)

    def sequence():
        return SequentialTrainer(
            tiny_model_path, [fast_grpo_config(tmp_path, max_steps=4)], output_dir=tmp_path / "run",
            reward_funcs=digit_reward, train_dataset=digit_prompts(8),
        )  # fmt: skip

    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)  # should ours not take it, pytest lives on
    try:
        with pytest.raises(TrainingPreempted) as stopped:
            sequence().train()
        stage = tmp_path / "run" / "stage-0-grpo"
        assert stopped.value.checkpoint == str(stage / "checkpoint-3") and stopped.value.code == 143
        assert checkpoint_names(stage) == ["checkpoint-3"] and not (tmp_path / "run" / LOCK_FILE).exists()
        calls.update(count=0, signal_at=None)
        final = sequence().train()
        assert final == stage / "final" and (final / "model.safetensors").is_file()
        assert calls["count"] == 1  # only step 4 ran
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.mark.slow
def test_a_run_killed_mid_phase_resumes_to_the_uninterrupted_result(tmp_path, tiny_model_path):
    script = SCRIPTS / "evolm_until_killed.py"

    def run(output_dir, *flags):
        command = [sys.executable, str(script), tiny_model_path, str(output_dir), *flags]
        return subprocess.run(command, capture_output=True, text=True, timeout=600)

    killed = run(tmp_path / "killed", "--kill-in-phase", "0", "--kill-at-step", "3")  # after the policy checkpoint-2
    assert killed.returncode == -9, killed.stderr[-2000:]
    policy = tmp_path / "killed" / "stage-0-policy-es"
    assert (policy / "dataset").is_dir() and (policy / "checkpoint-2").is_dir() and not (policy / "final").exists()
    resumed = run(tmp_path / "killed")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    clean = run(tmp_path / "clean")
    assert clean.returncode == 0, clean.stderr[-2000:]

    start = load_file(Path(tiny_model_path) / "model.safetensors")
    for phase in ("stage-0-policy-es", "stage-1-rubric-es"):
        resumed_weights = load_file(tmp_path / "killed" / phase / "final" / "model.safetensors")
        clean_weights = load_file(tmp_path / "clean" / phase / "final" / "model.safetensors")
        assert resumed_weights.keys() == clean_weights.keys()
        assert all(torch.equal(resumed_weights[k], clean_weights[k]) for k in clean_weights), phase
        assert any(not torch.equal(start[k], clean_weights[k]) for k in start), f"{phase}: the weights never moved"
