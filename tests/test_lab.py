"""The coverage lab (`python -m trl_es.lab`): the --quick smoke run writes the JSON, the plots and the report."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trl_es.lab import METHODS, LabSettings, quick_settings, spread

REPO = Path(__file__).parents[1]


def test_the_grpo_budget_equals_the_es_budget():
    settings = LabSettings()
    assert settings.grpo_steps * settings.completions_per_grpo_step == settings.budget
    assert settings.budget == settings.es_steps * settings.population_size * settings.prompts_per_step
    quick = quick_settings()
    assert quick.grpo_steps * quick.completions_per_grpo_step == quick.budget


def test_a_budget_that_does_not_split_into_whole_steps_is_refused():
    with pytest.raises(ValueError, match="does not split"):
        LabSettings(es_steps=3).grpo_steps  # noqa: B018


def test_spread_gives_mean_std_and_values():
    assert spread([1.0, 3.0]) == {"mean": 2.0, "std": pytest.approx(2**0.5), "values": [1.0, 3.0]}
    assert spread([0.5])["std"] == 0.0


@pytest.mark.slow
def test_the_quick_lab_writes_results_plots_and_report(tmp_path):
    output_dir = tmp_path / "lab"
    command = [sys.executable, "-m", "trl_es.lab", "--quick", "--seeds", "2", "--output_dir", str(output_dir)]
    command += ["--work_dir", str(tmp_path / "work")]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run(command, cwd=tmp_path, env=env, check=True, timeout=600, capture_output=True)

    results = json.loads((output_dir / "results.json").read_text())
    assert set(results["summary"]) == set(METHODS)
    for method in METHODS:
        metrics = results["summary"][method]
        for name in ("greedy_accuracy", "entropy", "shift", *(f"pass@{k}" for k in (1, 2, 4, 8, 16)), "maj@16"):
            assert set(metrics[name]) == {"mean", "std", "values"}
    for method in METHODS[1:]:
        assert set(results["runs"][method]) == {"0", "1"}
        assert results["summary"][method]["shift"]["mean"] > 0
        curve = results["runs"][method]["0"]["curve"]
        assert curve["completions"][-1] == results["budget"] and len(curve["reward"]) == len(curve["completions"])
    assert {"js_diversity/start", "js_diversity/end", "sparse-78/pass@1"} <= set(results["summary"]["es"])
    assert "js_diversity/end" in results["summary"]["grpo-then-es"]
    assert results["grpo_learning_rate"] in [entry["learning_rate"] for entry in results["grpo_lr_sweep"]]
    assert (output_dir / "pass_at_k.png").stat().st_size > 0
    assert (output_dir / "reward_curves.png").stat().st_size > 0
    report = (tmp_path / "lab.md").read_text()
    assert "](lab/pass_at_k.png)" in report and "](lab/reward_curves.png)" in report
    assert "python -m trl_es.lab --quick" in report
