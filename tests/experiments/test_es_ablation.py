"""The ES ablation (`python -m experiments.es_ablation`): equal budgets, one knob per variant, the choice made on
training problems only, intervals in the report; the quick run writes the JSON and the report."""

import json
import os
import subprocess
import sys

import pytest
from scripts.paths import REPO

from experiments.es_ablation.cli import main
from experiments.es_ablation.jobs import es_config
from experiments.es_ablation.report import chosen, measurements, render_markdown
from experiments.es_ablation.settings import DEFAULT, VARIANTS, AblationSettings
from trl_es import ESConfig
from trl_es.demo.run import DEMO


@pytest.mark.parametrize("name", list(VARIANTS))
def test_every_variant_spends_the_budget_and_changes_only_its_own_fields(name, tmp_path):
    settings, variant = AblationSettings(), VARIANTS[name]
    spent = settings.steps(variant) * settings.completions_per_step(variant)
    assert settings.budget <= spent < settings.budget + settings.completions_per_step(variant)
    config = es_config(settings, name, str(tmp_path), seed=0).to_dict()
    default = es_config(settings, DEFAULT, str(tmp_path), seed=0).to_dict()
    changed = {field for field in config if config[field] != default[field]}
    assert changed - {"max_steps", "per_device_train_batch_size"} == set(variant.overrides)
    assert set(variant.overrides) <= set(ESConfig.__dataclass_fields__)


def test_the_default_variant_is_the_demos_es():
    config = es_config(AblationSettings(), DEFAULT, "out", seed=0)
    assert (config.population_size, config.sigma, config.learning_rate) == (
        DEMO.population_size,
        DEMO.sigma,
        DEMO.learning_rate,
    )
    assert config.fitness_shaping == "zscore" and not config.antithetic and config.es_optimizer == "sgd"


def synthetic_results(train: dict[str, list[float]], held_out: dict[str, list[float]]) -> dict:
    """Results of one seed on 4 problems with the given per-problem training and held-out correctness."""

    def run(variant):
        return {"train": {"greedy_correct": train[variant]}, "held_out": {
            "greedy_correct": held_out[variant], "correct_samples": [4 * c for c in held_out[variant]]}}  # fmt: skip

    settings = {"seeds": [0], "samples_per_prompt": 4, "bootstrap_draws": 200}
    return {"settings": settings, "runs": {variant: {"0": run(variant)} for variant in train}}


def test_the_setting_is_chosen_on_training_problems_never_on_held_out_ones():
    results = synthetic_results(
        train={DEFAULT: [1, 1, 0, 0], "n8": [1, 1, 1, 0], "n32": [0, 0, 0, 0]},
        held_out={DEFAULT: [1, 1, 0, 0], "n8": [0, 0, 0, 0], "n32": [1, 1, 1, 1]},
    )
    measured = measurements(results)
    assert chosen(results, measured, [DEFAULT, "n8", "n32"]) == "n8"  # best on training, worst held out
    assert measured["n32"]["greedy"]["vs_default"]["mean"] == pytest.approx(0.5)
    n8 = measured["n8"]["greedy"]["vs_default"]
    assert n8["mean"] == pytest.approx(-0.5) and n8["ci"][0] == -1.0 and n8["ci"][1] <= 0


def test_identical_runs_differ_by_zero_with_p_one():
    same = [1, 0, 1, 0]
    measured = measurements(synthetic_results({DEFAULT: same, "n8": same}, {DEFAULT: same, "n8": same}))
    difference = measured["n8"]["greedy"]["vs_default"]
    assert difference["mean"] == 0 and difference["ci"] == [0, 0] and difference["p"] == 1.0


def test_report_rewrites_the_committed_report_from_the_committed_results(tmp_path):
    output_dir = tmp_path / "ablation"
    output_dir.mkdir()
    (output_dir / "results.json").write_bytes((REPO / "docs" / "ablation" / "results.json").read_bytes())
    main(["--report", "--output_dir", str(output_dir)])
    assert (tmp_path / "ablation.md").read_text() == (REPO / "docs" / "ablation.md").read_text()
    assert (output_dir / "held_out_differences.png").stat().st_size > 0


@pytest.mark.slow
def test_the_quick_ablation_writes_results_and_a_report_with_intervals(tmp_path):
    output_dir = tmp_path / "ablation"
    command = [sys.executable, "-m", "experiments.es_ablation", "--quick", "--seeds", "2", "--output_dir",
               str(output_dir), "--work_dir", str(tmp_path / "work"), "--variants", "sigma-adaptive"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run(command, cwd=tmp_path, env=env, check=True, timeout=600, capture_output=True)

    results = json.loads((output_dir / "results.json").read_text())
    assert set(results["runs"]) == {DEFAULT, "sigma-adaptive"}
    for by_seed in results["runs"].values():
        assert set(by_seed) == {"0", "1"}
        for run in by_seed.values():
            assert run["completions"] >= results["settings"]["budget"]
            assert len(run["held_out"]["greedy_correct"]) == results["settings"]["num_held_out"]
            assert len(run["train"]["greedy_correct"]) == results["settings"]["num_train_eval"]
    adaptive = results["runs"]["sigma-adaptive"]["0"]
    assert len(adaptive["js_diversity"]) == len(adaptive["curve"]["es/sigma"])  # the adaptive sigma measures it
    report = (tmp_path / "ablation.md").read_text()
    assert "adaptive σ" in report and "p=" in report and "[" in report
    assert report == render_markdown(results, measurements(results), {
        "plot": "ablation/held_out_differences.png", "json": "ablation/results.json"})  # fmt: skip
