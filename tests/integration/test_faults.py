"""A run killed with SIGKILL (kill -9) mid-step, an ES run or an EVOLM run mid-phase, resumes from its last checkpoint
and ends with the uninterrupted weights."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from scripts.paths import SCRIPTS

SCRIPT = SCRIPTS / "train_until_killed.py"


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_sigkill_mid_training_then_resume_matches_an_uninterrupted_run(tmp_path, tiny_model_path):
    killed_dir = tmp_path / "killed"
    # 4 members per step: reward call 19 is the third member of step 5, after checkpoint-4 was written.
    killed = run(tiny_model_path, killed_dir, "--kill-at-reward-call", 19)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert sorted(p.name for p in killed_dir.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    assert not (killed_dir / "final").exists()

    resumed = run(tiny_model_path, killed_dir, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    clean = run(tiny_model_path, tmp_path / "clean")
    assert clean.returncode == 0, clean.stderr[-2000:]

    resumed_weights = load_file(killed_dir / "final" / "model.safetensors")
    clean_weights = load_file(tmp_path / "clean" / "final" / "model.safetensors")
    assert resumed_weights.keys() == clean_weights.keys()
    assert all((resumed_weights[k] == clean_weights[k]).all() for k in clean_weights)


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
