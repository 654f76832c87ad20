"""The coverage lab (`python -m experiments.coverage_lab`): budgets, summaries, help texts and the report; the
--quick smoke run writes the JSON, the plots and the report."""

import json
import os
import subprocess
import sys
from dataclasses import replace

import pytest
import torch
from scripts.paths import REPO

from experiments.coverage_lab.cli import es_variant_settings, main, parse_args
from experiments.coverage_lab.comparisons import comparisons, goal
from experiments.coverage_lab.report import render_markdown
from experiments.coverage_lab.settings import METHODS, LabSettings, equal_seconds, quick_settings
from experiments.coverage_lab.training import es_config
from experiments.harness import cached_job, load_average, spread
from trl_es.demo.run import DEMO


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


def test_a_job_runs_on_its_threads_and_gives_the_process_its_own_back(tmp_path):
    # A lab run inside a test once left the whole test session on one thread from there on.
    threads = torch.get_num_threads()
    result = cached_job(tmp_path / "job", lambda: {"threads": torch.get_num_threads()}, threads=threads + 1)
    assert result["threads"] == threads + 1
    assert torch.get_num_threads() == threads
    with pytest.raises(ZeroDivisionError):
        cached_job(tmp_path / "failing", lambda: {"ratio": 1 / 0}, threads=threads + 1)
    assert torch.get_num_threads() == threads


def test_the_lab_runs_es_with_the_demos_settings(tmp_path):
    settings = LabSettings()
    lab = es_config(settings, str(tmp_path), DEMO.max_steps, seed=0).to_dict()
    demo = DEMO.es_config(str(tmp_path), 0, logging_steps=settings.logging_steps, disable_tqdm=True).to_dict()
    assert lab == demo


def test_the_help_states_the_real_defaults(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"ES steps (default {LabSettings().es_steps}, {quick_settings().es_steps} with --quick;" in help_text
    assert f"default {len(LabSettings().seeds)})" in help_text
    assert parse_args([]).seeds == len(LabSettings().seeds)


def test_the_report_says_unavailable_when_the_load_average_is(monkeypatch, tmp_path):
    def no_load_average():
        raise OSError("Load average is unobtainable")

    monkeypatch.setattr(os, "getloadavg", no_load_average)
    assert load_average() is None
    monkeypatch.delattr(os, "getloadavg")
    assert load_average() is None
    results = json.loads((REPO / "docs" / "lab" / "results.json").read_text())
    results["machine"]["load_average_at_start"] = None
    plots = {name: tmp_path / "lab" / name for name in ("pass_at_k", "frontier", "curves", "json")}
    assert "(load average unavailable at the start)" in render_markdown(results, tmp_path / "lab.md", plots)


@pytest.mark.parametrize("lab", ["lab", "lab_seconds"])  # equal completions, equal training seconds
def test_report_rewrites_the_committed_report_from_the_committed_results(tmp_path, capsys, lab):
    output_dir = tmp_path / lab
    output_dir.mkdir()
    (output_dir / "results.json").write_bytes((REPO / "docs" / lab / "results.json").read_bytes())
    main(["--report", "--output_dir", str(output_dir)])
    assert (tmp_path / f"{lab}.md").read_text() == (REPO / "docs" / f"{lab}.md").read_text()
    assert (output_dir / "pass_at_k.png").stat().st_size > 0 and (output_dir / "reward_curves.png").stat().st_size > 0
    assert f"wrote {output_dir / 'pass_at_k.png'}" in capsys.readouterr().out


def test_report_without_a_results_file_says_to_run_the_lab_first(tmp_path):
    with pytest.raises(SystemExit, match="run the lab first"):
        main(["--report", "--output_dir", str(tmp_path / "lab")])


@pytest.mark.slow
def test_the_quick_lab_writes_results_plots_and_report(tmp_path):
    output_dir = tmp_path / "lab"
    command = [
        sys.executable,
        "-m",
        "experiments.coverage_lab",
        "--quick",
        "--seeds",
        "2",
        "--output_dir",
        str(output_dir),
    ]
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
    assert "python -m experiments.coverage_lab --quick" in report


def test_equal_seconds_gives_es_the_steps_that_grpos_seconds_buy():
    settings = equal_seconds(LabSettings(), {"es": 1.5, "grpo": 4.0})
    assert settings.grpo_steps == LabSettings().grpo_steps  # GRPO keeps its completion-budget steps
    assert settings.es_steps == 2 * round(LabSettings().grpo_steps * 4.0 / 1.5 / 2) and settings.es_steps % 2 == 0
    assert settings.equal == "seconds" and settings.seconds_per_step == {"es": 1.5, "grpo": 4.0}


def test_an_ablation_variant_sets_the_labs_es_fields():
    fields = es_variant_settings("n32")
    assert fields == {"es_variant": "n32", "es_overrides": {}, "population_size": 32}
    settings = replace(LabSettings(), **es_variant_settings("pass-at-4"))
    assert settings.completions_per_es_step == 16 * 64 * 4  # four samples of every prompt per member
    with pytest.raises(SystemExit, match="not an ES ablation variant"):
        es_variant_settings("n7")


def lab_results(per_method_success: dict[str, list[float]], seeds=(0,)) -> dict:
    """Results of a lab on 4 problems, with each method's per-problem success rate of 4 samples (same each seed)."""
    runs = {
        method: {str(seed): {"held_out": {"success_probs": probs, "greedy_correct": [float(p >= 0.5) for p in probs]}}
                 for seed in (seeds if method != "base" else seeds[:1])}
        for method, probs in per_method_success.items()
    }  # fmt: skip
    return {"settings": {"seeds": list(seeds), "samples_per_prompt": 4}, "runs": runs}


def test_comparisons_pair_methods_on_the_same_problems_and_read_the_goal():
    success = {"base": [0.5, 0.5, 0.25, 0.0], "es": [0.75, 0.75, 0.25, 0.0], "grpo": [1.0, 0.75, 0.0, 0.0],
               "es-then-grpo": [1.0, 1.0, 0.25, 0.0], "grpo-then-es": [1.0, 0.75, 0.5, 0.25]}  # fmt: skip
    results = lab_results(success, seeds=(0, 1))
    found = comparisons(results, "grpo")
    assert found["es"]["pass@4"]["difference"]["mean"] == pytest.approx((3 - 2) / 4)  # solved at least once: 3 vs 2
    assert "difference" not in found["grpo"]["pass@1"]
    assert found["base"]["greedy"]["interval"]["mean"] == pytest.approx(0.5)  # the base's one run, every seed
    reached = goal(results, found)
    assert reached["ES within one standard error of GRPO at Pass@1"] is True  # equal: 1.75 / 4 each
    assert reached["ES above GRPO at every k ≥ 4"] is True  # Pass@4: ES 0.75, GRPO 0.5
    assert reached["ES→GRPO or GRPO→ES the best Pass@4"] is True  # GRPO→ES: 1.0 (4 samples: Pass@4 is the largest)
    same = comparisons(lab_results({"base": success["base"], "es": success["es"], "grpo": success["es"]}), "grpo")
    assert same["es"]["pass@4"]["difference"] | {"p": None} == {"mean": 0.0, "se": 0.0, "ci": [0.0, 0.0], "p": None}
    assert same["es"]["pass@4"]["difference"]["p"] == 1.0


@pytest.mark.slow
def test_the_quick_equal_seconds_lab_gives_every_method_grpos_training_seconds(tmp_path):
    output_dir = tmp_path / "lab"
    command = [sys.executable, "-m", "experiments.coverage_lab", "--quick", "--equal", "seconds", "--seeds", "1",
               "--output_dir", str(output_dir), "--work_dir", str(tmp_path / "work")]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run(command, cwd=tmp_path, env=env, check=True, timeout=600, capture_output=True)

    results = json.loads((output_dir / "results.json").read_text())
    settings, per_step = results["settings"], results["settings"]["seconds_per_step"]
    assert settings["equal"] == "seconds" and per_step["es"] > 0 and per_step["grpo"] > 0
    assert settings["es_steps"] == max(2, 2 * round(results["grpo_steps"] * per_step["grpo"] / per_step["es"] / 2))
    for method in METHODS[1:]:
        for run in results["runs"][method].values():
            assert run["training_seconds"]["cpu"] > 0 and len(run["held_out"]["greedy_correct"]) == 16
    report = (tmp_path / "lab.md").read_text()
    assert "CPU seconds of training steps" in report and "The goal at equal training seconds:" in report
    assert "### Against GRPO" in report and "<br>Δ" in report
