"""`compare_checkpoints` with intervals: per-prompt values in the report, a bootstrap interval for every metric, a
paired interval and sign-flip test for every difference, the refusal to pair unpaired reports, and `trl-es analyze
compare` with `--json` and a math benchmark."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from scripts.paths import REPO

from trl_es.cli.main import main
from trl_es.demo.run import DEMO_MODEL
from trl_es.evaluation.comparison import (
    check_pairable,
    compare_checkpoints,
    comparison_statistics,
    format_comparison,
    load_eval_dataset,
    paired_differences,
)
from trl_es.evaluation.coverage import CoverageReport

MATH500 = REPO / "tests" / "fixtures" / "benchmarks" / "math500.jsonl"


@pytest.fixture(scope="module")
def damaged(tmp_path_factory):
    """The demo model with noise of scale 1 on every weight: it has forgotten its arithmetic."""
    path = shutil.copytree(DEMO_MODEL, tmp_path_factory.mktemp("damaged") / "damaged")
    generator = torch.Generator().manual_seed(0)
    for file in path.glob("*.safetensors"):
        weights = load_file(file)
        noisy = {name: t + torch.randn(t.shape, generator=generator) for name, t in sorted(weights.items())}
        save_file(noisy, file, metadata={"format": "pt"})
    return path


@pytest.fixture(scope="module")
def reports(damaged):
    dataset = load_eval_dataset("arithmetic", num_problems=48)
    return compare_checkpoints([DEMO_MODEL, damaged], [dataset], ks=(1, 4), samples_per_prompt=4)


def test_the_report_holds_the_per_prompt_values_behind_each_mean(reports):
    report = reports["arithmetic"][str(DEMO_MODEL)]
    assert list(report.as_dict()) == ["greedy_accuracy", "pass@1", "pass@4", "maj@1", "maj@4", "entropy"]
    for name, values in report.per_prompt().items():
        assert len(values) == 48 and sum(values) / 48 == pytest.approx(report.as_dict()[name])
    assert report.seed == 1234 and len(report.problems_digest) == 64


def test_forgetting_shows_as_a_negative_paired_difference_with_a_small_p_value(reports, damaged):
    statistics = comparison_statistics(reports, draws=2000)["arithmetic"]
    greedy = statistics["differences"][str(damaged)]["greedy_accuracy"]
    assert greedy.interval.mean < 0 and greedy.interval.high < 0 and greedy.p_value < 0.01
    base_interval = statistics["intervals"][str(DEMO_MODEL)]["greedy_accuracy"]
    assert base_interval.low < base_interval.mean < base_interval.high


def test_the_table_shows_intervals_and_paired_differences(reports):
    table = format_comparison(reports, comparison_statistics(reports, draws=500))
    greedy_row = next(line for line in table.splitlines() if line.startswith("greedy_accuracy"))
    assert greedy_row.count("[") == 3 and "Δ -0." in greedy_row and "p=" in greedy_row
    assert "entropy" in table and "48 problems, 4 samples per problem" in table


def test_the_statistics_repeat_with_the_bootstrap_seed(reports):
    first, again = (format_comparison(reports, comparison_statistics(reports, draws=300, seed=7)) for _ in range(2))
    assert first == again


def unpaired(**changes) -> CoverageReport:
    fields = {
        "greedy_accuracy": 0.5,
        "greedy_correct": [1.0, 0.0],
        "seed": 1,
        "problems_digest": "abc",
        "num_prompts": 2,
    }
    return CoverageReport(**{**fields, **changes})


def test_a_report_of_identical_measurements_differs_by_zero_with_p_one():
    (difference,) = paired_differences(unpaired(), unpaired()).values()
    assert difference.as_dict() == {"mean": 0.0, "se": 0.0, "ci": [0.0, 0.0], "p_value": 1.0}


def test_reports_of_other_problems_are_not_paired():
    with pytest.raises(ValueError, match="not measured on the same problems.*same dataset and --num_problems"):
        check_pairable(unpaired(), unpaired(problems_digest="def"))


def test_reports_sampled_with_other_seeds_are_not_paired():
    with pytest.raises(ValueError, match="tuned was sampled with seed 2 and base with seed 1.*same --seed"):
        check_pairable(unpaired(), unpaired(seed=2))


def test_analyze_compare_writes_intervals_tests_and_per_problem_values_as_json(damaged, tmp_path, capsys):
    path = tmp_path / "compare.json"
    argv = ["analyze", "compare", str(DEMO_MODEL), str(damaged), "--num_problems", "8", "--ks", "1", "2"]
    assert main(argv + ["--json", str(path), "--bootstrap_draws", "200", "--seed", "7"]) == 0
    assert str(path) in capsys.readouterr().out
    written = json.loads(path.read_text())
    assert written["settings"]["seed"] == 7 and written["settings"]["bootstrap_draws"] == 200
    dataset = written["datasets"]["arithmetic"]
    assert dataset["base"] == str(DEMO_MODEL) and dataset["num_problems"] == 8
    metrics = dataset["checkpoints"][str(damaged)]["metrics"]
    assert set(metrics) == {"greedy_accuracy", "pass@1", "pass@2", "maj@1", "maj@2"}
    assert set(metrics["pass@2"]) == {"mean", "se", "ci"}
    assert len(dataset["checkpoints"][str(damaged)]["per_prompt"]["greedy_accuracy"]) == 8
    assert set(dataset["differences"][str(damaged)]["greedy_accuracy"]) == {"mean", "se", "ci", "p_value"}


def test_analyze_compare_evaluates_a_math_benchmark_from_a_local_file(tiny_model_path, tmp_path, capsys):
    copy = shutil.copytree(tiny_model_path, tmp_path / "tuned")
    argv = ["analyze", "compare", tiny_model_path, str(copy), "--dataset", f"math500:{MATH500}", "--ks", "1", "2"]
    assert main(argv + ["--max_new_tokens", "4", "--bootstrap_draws", "100"]) == 0
    output = capsys.readouterr().out
    assert output.splitlines()[0].split()[0] == "math500" and "5 problems, 2 samples per problem" in output
    assert "maj@2" in output and "p=1.000" in output  # a copy: every difference is exactly 0
