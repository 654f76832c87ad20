"""The rubric lab (`python -m experiments.rubric_lab`): equal budgets, and a measured report from a real (tiny) run."""

from dataclasses import replace

from scripts.paths import REPO

from experiments.rubric_lab.cli import main, run_lab
from experiments.rubric_lab.settings import METHODS, RubricLabSettings, quick_settings


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


def test_the_lab_writes_results_a_plot_and_a_report(tmp_path):
    settings = replace(quick_settings(), methods=("base",), models=("joint",))
    settings = replace(settings, demo=replace(settings.demo, num_held_out=32))
    markdown = tmp_path / "rubric_lab.md"
    results = run_lab(settings, tmp_path / "out", markdown, tmp_path / "work", "test", log=lambda _: None)
    base = results["summary"]["joint"]["base"]
    assert 0 <= base["greedy_accuracy"]["mean"] <= 1
    assert (tmp_path / "out" / "headline.png").is_file()
    report = markdown.read_text()
    assert "| base |" in report and "What the toy can and cannot test" in report


def test_report_rewrites_the_committed_report_from_the_committed_results(tmp_path, capsys):
    output_dir = tmp_path / "rubric_lab"
    output_dir.mkdir()
    (output_dir / "results.json").write_bytes((REPO / "docs" / "rubric_lab" / "results.json").read_bytes())
    main(["--report", "--output_dir", str(output_dir)])
    assert (tmp_path / "rubric_lab.md").read_text() == (REPO / "docs" / "rubric_lab.md").read_text()
    assert (output_dir / "headline.png").stat().st_size > 0
    assert f"wrote {output_dir / 'headline.png'}" in capsys.readouterr().out
