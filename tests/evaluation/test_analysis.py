"""Analysis tools: parameter shift, sparsification, forgetting tables, training curves, plots and `trl-es analyze`."""

import json
import math
import shutil
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from trl_es.cli.main import main
from trl_es.demo.run import DEMO_MODEL
from trl_es.evaluation.analysis import module_of, parameter_shift, read_log_history, sparsify, training_curves
from trl_es.evaluation.comparison import compare_checkpoints, forgetting, format_comparison, load_eval_dataset
from trl_es.evaluation.coverage import CoverageReport
from trl_es.evaluation.plots import plot_pass_at_k, plot_shift_histogram, plot_training_curves
from trl_es.testing import save_tiny_model


def weights(checkpoint) -> dict[str, torch.Tensor]:
    return {
        name: tensor for file in sorted(checkpoint.glob("*.safetensors")) for name, tensor in load_file(file).items()
    }


def flat(checkpoint) -> torch.Tensor:
    return torch.cat([tensor.flatten() for _, tensor in sorted(weights(checkpoint).items())])


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("base"))


@pytest.fixture(scope="module")
def tuned(base, tmp_path_factory):
    """The base with seeded Gaussian noise of scale 0.01 on every coordinate."""
    path = tmp_path_factory.mktemp("tuned")
    shutil.copytree(base, path, dirs_exist_ok=True)
    generator = torch.Generator().manual_seed(0)
    perturbed = {
        name: tensor + 0.01 * torch.randn(tensor.shape, generator=generator)
        for name, tensor in sorted(weights(base).items())
    }
    save_file(perturbed, path / "model.safetensors", metadata={"format": "pt"})
    return path


def round_half_up(x: float) -> int:
    return math.floor(x + 0.5)


# Parameter shift


def test_module_of_cuts_parameter_names_to_the_prefix_depth():
    assert module_of("model.layers.0.self_attn.q_proj.weight") == "model.layers.0.self_attn"
    assert module_of("model.layers.0.self_attn.q_proj.weight", depth=3) == "model.layers.0"
    assert module_of("model.embed_tokens.weight") == "model.embed_tokens"
    assert module_of("lm_head.weight") == "lm_head"


def test_parameter_shift_matches_a_direct_computation(base, tuned):
    shift = parameter_shift(base, tuned)
    base_weights, tuned_weights = weights(base), weights(tuned)
    delta = flat(tuned) - flat(base)
    assert shift.relative_l2 == pytest.approx((delta.norm() / flat(base).norm()).item(), rel=1e-5)
    attention = [name for name in base_weights if name.startswith("model.layers.1.self_attn.")]
    attention_delta = torch.cat([(tuned_weights[name] - base_weights[name]).flatten() for name in attention])
    attention_base = torch.cat([base_weights[name].flatten() for name in attention])
    expected = (attention_delta.norm() / attention_base.norm()).item()
    assert shift.per_module["model.layers.1.self_attn"] == pytest.approx(expected, rel=1e-5)
    assert shift.num_parameters == delta.numel() and shift.num_unchanged == int((delta == 0).sum())
    assert sum(shift.histogram_counts) == shift.num_parameters - shift.num_unchanged
    assert len(shift.histogram_edges) == len(shift.histogram_counts) + 1
    assert shift.histogram_edges[0] <= delta.abs()[delta != 0].min() and delta.abs().max() <= shift.histogram_edges[-1]


def test_a_checkpoint_has_no_shift_from_itself(base):
    shift = parameter_shift(base, base)
    assert shift.relative_l2 == 0 and set(shift.per_module.values()) == {0.0}
    assert shift.num_unchanged == shift.num_parameters and shift.histogram_counts == []


# Sparsification


@pytest.fixture(scope="module")
def sparse_checkpoints(base, tuned, tmp_path_factory):
    percents = (0, 50, 78, 100)
    return dict(zip(percents, sparsify(base, tuned, percents, tmp_path_factory.mktemp("sparse")), strict=True))


@pytest.mark.parametrize("percent", [0, 50, 78, 100])
def test_sparsify_resets_exactly_round_p_percent_of_the_coordinates(percent, base, tuned, sparse_checkpoints):
    base_values, tuned_values, sparse_values = flat(base), flat(tuned), flat(sparse_checkpoints[percent])
    assert bool((tuned_values != base_values).all())  # the noise moved every coordinate
    num_reset = round_half_up(percent / 100 * base_values.numel())
    assert int((sparse_values != tuned_values).sum()) == num_reset
    assert int((sparse_values != base_values).sum()) == base_values.numel() - num_reset
    magnitude = (tuned_values - base_values).abs()
    reset = sparse_values == base_values
    if 0 < percent < 100:
        assert magnitude[reset].max() <= magnitude[~reset].min()  # the smallest |Δθ| went back to the base


def test_sparse_checkpoints_keep_the_config_and_tokenizer(tuned, sparse_checkpoints):
    expected = sorted(path.name for path in tuned.iterdir())
    assert sorted(path.name for path in sparse_checkpoints[50].iterdir()) == expected
    assert sparse_checkpoints[50].name == "sparse-50"


def test_sparsify_breaks_ties_to_reset_the_exact_count_across_shards(tmp_path):
    base, tuned = tmp_path / "base", tmp_path / "tuned"
    base.mkdir(), tuned.mkdir()
    zeros = {"a.weight": torch.zeros(7, 3), "b.weight": torch.zeros(11)}
    steps = {"a.weight": torch.full((7, 3), 0.25), "b.weight": torch.tensor([0.25] * 5 + [0.5] * 6)}
    for name in zeros:  # one shard per parameter
        save_file({name: zeros[name]}, base / f"{name}.safetensors")
        save_file({name: steps[name]}, tuned / f"{name}.safetensors")
    (sparse,) = sparsify(base, tuned, [37.5], tmp_path / "out")
    assert int((flat(sparse) != 0).sum()) == 32 - 12  # 37.5% of 32 coordinates, all tied at 0.25, are reset


def test_sparsify_rejects_a_percentage_outside_0_to_100(base, tuned, tmp_path):
    with pytest.raises(ValueError, match="between 0 and 100"):
        sparsify(base, tuned, [120], tmp_path)


# Forgetting


def test_the_demo_model_against_a_copy_of_itself_forgets_nothing(tmp_path):
    copy = shutil.copytree(DEMO_MODEL, tmp_path / "copy")
    dataset = load_eval_dataset("arithmetic", num_problems=16)
    reports = compare_checkpoints([DEMO_MODEL, copy], [dataset], ks=(1, 4), samples_per_prompt=4)
    base_report, copy_report = reports["arithmetic"].values()
    assert base_report.num_prompts == 16 and base_report.samples_per_prompt == 4
    assert set(forgetting(base_report, copy_report).values()) == {0.0}
    table = format_comparison(reports)
    assert "pass@4" in table and "maj@4" in table and "+0.000" in table


def test_forgetting_is_tuned_minus_base():
    base = CoverageReport(0.5, {1: 0.4, 4: 0.8}, {1: 0.4, 4: 0.6})
    tuned = CoverageReport(0.75, {1: 0.5, 4: 0.7}, {1: 0.5, 4: 0.6})
    deltas = forgetting(base, tuned)
    assert deltas["greedy_accuracy"] == 0.25 and deltas["pass@4"] == pytest.approx(-0.1) and deltas["maj@4"] == 0


def test_a_local_json_dataset_is_checked_with_the_arithmetic_extractor(tmp_path):
    path = tmp_path / "held_out.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": f"{k} + 1 =", "answer": k + 1}) for k in range(5)))
    dataset = load_eval_dataset(str(path), num_problems=3)
    assert dataset.name == "held_out" and dataset.references == ["1", "2", "3"]
    assert dataset.extract_answer(" 12 apples") == "12"


def test_comparing_a_checkpoint_with_itself_by_the_same_path_is_refused():
    with pytest.raises(ValueError, match="twice"):
        compare_checkpoints([DEMO_MODEL, DEMO_MODEL], [])


# Training curves


@pytest.fixture
def run_dir(tmp_path):
    """A run folder whose latest checkpoint logged reward and fitness at steps 10 and 20."""
    for step in (10, 20, 5):
        history = [
            {"step": s, "reward": s / 100, "es/fitness/mean": s / 50, "loss": 0.0} for s in range(10, step + 1, 10)
        ]
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text(json.dumps({"log_history": history}))
    return tmp_path


def test_training_curves_read_the_latest_checkpoint_logs(run_dir):
    assert len(read_log_history(run_dir)) == 2
    assert training_curves(run_dir) == {"reward": ([10, 20], [0.1, 0.2]), "es/fitness/mean": ([10, 20], [0.2, 0.4])}
    assert training_curves(run_dir, ["loss"]) == {"loss": ([10, 20], [0.0, 0.0])}


def test_training_curves_name_the_logged_keys_when_a_key_is_missing(run_dir):
    with pytest.raises(KeyError, match="logged keys"):
        training_curves(run_dir, ["kl"])


def test_a_folder_without_trainer_state_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="trainer_state.json"):
        read_log_history(tmp_path)


# Plots


def test_plots_are_written_as_non_empty_png_files(base, tuned, run_dir, tmp_path):
    paths = [
        plot_shift_histogram(parameter_shift(base, tuned), tmp_path / "shift.png"),
        plot_pass_at_k({"base": {1: 0.3, 2: 0.5, 4: 0.7}, "tuned": {1: 0.4, 2: 0.55, 4: 0.7}}, tmp_path / "k.png"),
        plot_training_curves({"run": training_curves(run_dir)}, tmp_path / "curves.png"),
    ]
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 1000


def test_plotting_without_matplotlib_says_what_to_install(monkeypatch, base, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r"pip install trl-es\[analysis\]"):
        plot_shift_histogram(parameter_shift(base, base), tmp_path / "shift.png")


# trl-es analyze


def test_analyze_shift_prints_the_table_and_writes_the_histogram(base, tuned, tmp_path, capsys):
    assert main(["analyze", "shift", str(base), str(tuned), "--plot", str(tmp_path / "shift.png")]) == 0
    output = capsys.readouterr().out
    assert "model.layers.0.self_attn" in output and "overall" in output
    assert (tmp_path / "shift.png").stat().st_size > 0


def test_analyze_sparsify_writes_and_evaluates_the_checkpoints(base, tuned, tmp_path, capsys):
    argv = ["analyze", "sparsify", str(base), str(tuned), "--percent", "50", "90", "--output_dir", str(tmp_path)]
    evaluation = ["--evaluate", "arithmetic", "--num_problems", "4", "--ks", "1", "2"]
    assert main(argv + evaluation) == 0
    output = capsys.readouterr().out
    assert (tmp_path / "sparse-50" / "model.safetensors").is_file() and (tmp_path / "sparse-90").is_dir()
    assert "sparse-90" in output and "pass@2" in output


def test_analyze_compare_prints_the_forgetting_table_and_plots_pass_at_k(tmp_path, capsys):
    copy = shutil.copytree(DEMO_MODEL, tmp_path / "tuned")
    argv = ["analyze", "compare", str(DEMO_MODEL), str(copy), "--num_problems", "4", "--ks", "1", "2"]
    assert main(argv + ["--plot", str(tmp_path / "passk.png")]) == 0
    output = capsys.readouterr().out
    # The columns are the checkpoints' folder names: the demo's `model/` and its copy `tuned/`.
    assert output.splitlines()[0].split()[1:3] == ["model", "tuned"] and "greedy_accuracy" in output
    assert (tmp_path / "passk.png").stat().st_size > 0


def test_analyze_curves_plots_the_runs(run_dir, tmp_path, capsys):
    assert main(["analyze", "curves", str(run_dir), "--plot", str(tmp_path / "curves.png")]) == 0
    assert "es/fitness/mean" in capsys.readouterr().out
    assert (tmp_path / "curves.png").stat().st_size > 0
