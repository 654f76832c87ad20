"""A run killed with SIGKILL mid-step resumes from its last checkpoint and ends with the uninterrupted weights."""

import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

SCRIPT = Path(__file__).parent / "scripts" / "train_until_killed.py"


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
