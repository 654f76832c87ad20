"""The rubric lab (`python -m experiments.rubric_lab`): equal budgets, the arms of each pretraining seed and their
gates, the paired bootstrap over runs and problems, and a measured report from a real (tiny) run."""

import re
import shutil
from dataclasses import replace

import numpy as np
import pytest
from scripts.paths import REPO

from experiments.rubric_lab.arms import arm_folders, lab_gates
from experiments.rubric_lab.cli import main, run_lab
from experiments.rubric_lab.jobs import Job
from experiments.rubric_lab.settings import METHODS, RubricLabSettings, quick_settings
from experiments.rubric_lab.stats import bootstrap, paired_difference
from trl_es.demo.evolm.gates import GateFailure
from trl_es.demo.evolm.settings import DEMO_MODELS


def test_methods_without_rubric_phases_spend_evolms_budget():
    settings = RubricLabSettings()
    demo = settings.demo
    policy_step = demo.population_size * demo.prompts_per_step  # completions
    rubric_step = demo.rubric_population_size * demo.rubric_prompts_per_step
    # completions + judge calls: one call per policy completion, two (chosen, rejected) per rubric
    evolm = demo.rounds * (demo.policy_steps * policy_step * 2 + demo.rubric_steps * rubric_step * 3)
    verifier_steps = settings.policy_steps_at_equal_budget(0)  # completions only
    assert 0 <= evolm - verifier_steps * policy_step < policy_step
    judged_steps = settings.policy_steps_at_equal_budget(1)  # a judge or reward-model call per completion
    assert 0 <= evolm - judged_steps * policy_step * 2 < policy_step * 2


def test_every_method_is_a_known_kind():
    evolm_fields = set(RubricLabSettings().demo.__dataclass_fields__)
    for method, changes in METHODS.items():
        assert changes is None or set(changes) <= evolm_fields, method


def _runs(correct_by_seed: dict[str, list[list[int]]]) -> dict:
    """Runs as a job records them, keyed "<pretraining seed>/<training seed>"."""
    return {f"{seed}/{index}": {"greedy_correct": correct} for seed, by_training in correct_by_seed.items()
            for index, correct in enumerate(by_training)}  # fmt: skip


def test_paired_difference_finds_a_real_gain_and_none_where_there_is_none():
    rng = np.random.default_rng(0)
    base = {str(seed): [list(rng.integers(0, 2, size=400))] for seed in range(3)}
    # 60 of 400 problems turned right on every pretraining seed: +0.15 at most, paired against the same problems
    gained = {seed: [[1 if index < 60 else value for index, value in enumerate(base[seed][0])]] for seed in base}
    difference = paired_difference(_runs(gained), _runs(base), draws=500)
    assert difference["above"] and 0.05 < difference["mean"] < 0.15 and difference["ci"][0] > 0
    same = paired_difference(_runs(base), _runs(base), draws=500)
    assert not same["above"] and same["mean"] == 0 and same["se"] == 0


def test_bootstrap_resamples_runs_and_problems():
    values = np.array([[1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 0.0]])
    found = bootstrap(values, draws=1000)
    assert found["mean"] == pytest.approx(0.5) and found["ci"][0] < 0.5 < found["ci"][1] and found["se"] > 0
    # runs that disagree on every problem: the run level alone gives an uncertainty the problems do not
    disagreeing = bootstrap(np.array([[1.0] * 50, [0.0] * 50]), draws=1000)
    assert disagreeing["se"] > 0.2


def test_runs_that_cannot_be_paired_are_refused_naming_them():
    with pytest.raises(ValueError, match=re.escape("Cannot pair runs ['0/0', '1/0'] with a baseline's runs ['0/0']")):
        paired_difference(_runs({"0": [[1, 0]], "1": [[1, 1]]}), _runs({"0": [[0, 0]]}), draws=10)


def test_the_base_model_is_one_job_for_every_training_seed():
    names = {Job(model, method, 0, seed, "work").name for model in ("joint",) for method in ("base", "static")
             for seed in (0, 1)}  # fmt: skip
    assert names == {"joint/pretrain0/base", "joint/pretrain0/static-seed0", "joint/pretrain0/static-seed1"}


def test_pretraining_seed_zero_is_the_shipped_pair_and_other_seeds_come_from_the_work_folder(tmp_path):
    assert arm_folders(0, tmp_path) == DEMO_MODELS
    for arm, shipped in DEMO_MODELS.items():
        shutil.copytree(shipped, tmp_path / "arms" / "seed1" / arm)
    found = arm_folders(1, tmp_path)  # both arms are there: reused, nothing pretrained
    assert found == {arm: tmp_path / "arms" / "seed1" / arm for arm in DEMO_MODELS}


@pytest.mark.slow
def test_the_lab_refuses_to_train_when_one_pretraining_seeds_gates_fail(tmp_path):
    # seed 1: the shipped arms swapped, so that "joint" has the null's rubrics (no net signal)
    for arm, other in (("joint", "null"), ("null", "joint")):
        shutil.copytree(DEMO_MODELS[other], tmp_path / "arms" / "seed1" / arm)
    printed = []
    settings = replace(quick_settings(), pretraining_seeds=(0, 1))
    with pytest.raises(GateFailure, match=r"^Pretraining seed 1: .*joint net signal = -0\.\d+ \(needs >= 0\.15\)"):
        lab_gates(settings, tmp_path, printed.append)
    assert [line.split(",")[0] for line in printed] == [
        "[rubric-lab] gates of pretraining seed 0",
        "[rubric-lab] gates of pretraining seed 1",
    ]


def test_the_lab_writes_results_plots_and_a_report(tmp_path):
    settings = replace(quick_settings(), methods=("base", "static"), models=("joint",))
    settings = replace(settings, demo=replace(settings.demo, num_held_out=32, policy_steps=2))
    markdown = tmp_path / "rubric_lab.md"
    results = run_lab(settings, tmp_path / "out", markdown, tmp_path / "work", "test", log=lambda _: None)
    base = results["summary"]["joint"]["base"]
    assert 0 <= base["greedy_accuracy"]["mean"] <= 1
    run = results["runs"]["joint"]["static"]["0/0"]
    assert len(run["greedy_correct"]) == 32 and np.mean(run["greedy_correct"]) == run["held_out"]["greedy_accuracy"]
    assert run["phases"][0]["role"] == "policy" and "held_out_accuracy" in run["phases"][0]["after"]
    assert set(results["intervals"]["joint"]["static"]) == {"accuracy", "vs_base"}
    assert (tmp_path / "out" / "headline.png").is_file() and (tmp_path / "out" / "phases.png").is_file()
    report = markdown.read_text()
    assert "| base |" in report and "| joint | static − base |" in report
    # what the policy phases did to the rubrics; a static run has no rubric phases
    assert re.search(r"\| joint \| static \| [+-]\d\.\d{3} \| [+-]\d\.\d{3} \| [+-]\d\.\d{3} \| — \| — \|", report)
    assert "What the toy can and cannot test" in report


@pytest.mark.parametrize("report", ["rubric_lab", "rubric_lab_methods"])
def test_report_rewrites_the_committed_report_from_the_committed_results(tmp_path, capsys, report):
    output_dir = tmp_path / report
    output_dir.mkdir()
    (output_dir / "results.json").write_bytes((REPO / "docs" / report / "results.json").read_bytes())
    main(["--report", "--output_dir", str(output_dir)])
    assert (tmp_path / f"{report}.md").read_text() == (REPO / "docs" / f"{report}.md").read_text()
    assert (output_dir / "headline.png").stat().st_size > 0
    assert f"wrote {output_dir / 'headline.png'}" in capsys.readouterr().out


def test_the_template_split_finds_a_gain_on_hard_templates_and_a_loss_on_easy_ones():
    from experiments.rubric_lab.stats import template_differences, template_groups

    hard = template_groups(200)["hard"]
    assert 0.3 < hard.mean() < 0.7  # both groups are there
    base = np.zeros(200)
    method = np.where(hard, 1.0, 0.0)  # right on every hard problem
    method[np.flatnonzero(~hard)[:10]] = -1.0  # pretend a loss on ten easy ones
    runs = {
        "joint": {
            "base": {"0/0": {"greedy_correct": base.tolist()}},
            "static": {"0/0": {"greedy_correct": method.tolist()}},
        }
    }
    found = template_differences(runs, draws=200)["joint"]["static"]
    assert found["hard"]["mean"] == pytest.approx(1.0)
    assert found["easy"]["mean"] == pytest.approx(-10 / (~hard).sum())
