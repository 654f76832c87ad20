"""The agent demo over seeds (`python -m experiments.tools_demo`): at a tiny size it runs the demo once per seed and
reports the mean and standard error over seeds; the committed report is redrawn from the committed results."""

import math
from pathlib import Path

import pytest

from experiments.tools_demo import main, standard_error

REPO = Path(__file__).resolve().parents[2]


def test_the_standard_error_is_the_sample_deviation_over_the_root_of_the_seeds():
    stat = standard_error([0.5, 0.7, 0.6])
    assert stat["mean"] == pytest.approx(0.6) and stat["se"] == pytest.approx(0.1 / math.sqrt(3))


def test_report_rewrites_the_committed_report_from_the_committed_results(tmp_path):
    output_dir = tmp_path / "tools_demo"
    output_dir.mkdir()
    (output_dir / "results.json").write_bytes((REPO / "docs" / "tools_demo" / "results.json").read_bytes())
    main(["--report", "--output_dir", str(output_dir)])
    assert (tmp_path / "tools_demo.md").read_text() == (REPO / "docs" / "tools_demo.md").read_text()


@pytest.mark.slow
def test_a_tiny_run_over_two_seeds_reports_every_seed_and_their_spread(tmp_path):
    output_dir = tmp_path / "tools_demo"
    results = main(["--seeds", "2", "--max_steps", "1", "--num_held_out", "8", "--output_dir", str(output_dir),
                    "--work_dir", str(tmp_path / "work")])  # fmt: skip
    assert [run["seed"] for run in results["runs"]] == [0, 1]
    success = results["summary"]["success"]
    assert success["before"]["se"] == 0.0  # the same model and questions before every seed's run
    assert success["after"]["values"] == [run["after"]["success"] for run in results["runs"]]
    assert "after, seed 1" in (tmp_path / "tools_demo.md").read_text()
