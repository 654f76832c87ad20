"""`make bench` on the smallest settings: every section runs and the last line carries the ratios."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parent.parent / "benchmarks" / "bench.py"
sys.path.insert(0, str(BENCH.parent))
import bench  # noqa: E402

TINY = ["--preset", "tiny", "--populations", "2", "--batch_sizes", "2", "--model_sizes", "tiny", "--scale_model",
        "tiny", "--sections", "memory", "speed", "lowrank", "processes", "scale"]  # fmt: skip


@pytest.mark.slow
def test_bench_prints_every_ratio_on_its_last_line():
    run = subprocess.run([sys.executable, str(BENCH), *TINY], capture_output=True, text=True, timeout=1800)
    assert run.returncode == 0, run.stderr[-3000:]
    last = run.stdout.strip().splitlines()[-1]
    assert last.startswith("RESULT ")
    result = json.loads(last[len("RESULT ") :])
    for key in ("memory_ratio_es_over_grpo", "memory_ratio_es_over_grpo_fp32", "memory_ratio_lowrank_over_grpo",
                "overhead_ratio_es_over_generation", "overhead_ratio_es_over_generation_small_batch",
                "lowrank_ratio_over_batched_generation", "lowrank_ratio_es_over_generation_n2",
                "fullrank_ratio_es_over_batched_generation_n2", "memory_ratio_es_lowrank_over_grpo",
                "time_ratio_es_over_grpo_per_step", "speedup_2_processes",
                "speedup_2_processes_unsharded_update"):  # fmt: skip
        assert result[key] > 0, key
    assert result["vllm_overhead_ratio"] is None and result["skipped"]["vllm"] == "not among --sections"
    # ES keeps no gradients and no optimizer state: it adds less memory than GRPO's AdamW step on the same model.
    assert result["memory_ratio_added_es_over_grpo"] < 1
    assert [row["population_size"] for row in result["scale"]["population_size"]] == [2]


def test_presets_set_defaults_that_explicit_flags_override():
    assert bench.parse_args([]).batch_size * bench.parse_args([]).max_completion_length >= 1000  # the users' regime
    assert bench.parse_args(["--preset", "gpu"]).memory_model == "0.5B"
    assert bench.parse_args(["--preset", "gpu", "--batch_size", "4"]).batch_size == 4
    assert bench.parse_args(["--full"]).preset == "full"


def test_a_setting_is_population_by_batch_by_tokens():
    assert bench.parse_setting("8x64x16") == (8, 64, 16)
    with pytest.raises(SystemExit, match="NxBxT"):
        bench.parse_setting("64x16")


def test_the_token_reward_scores_any_vocabulary():
    assert bench.even_token_fraction([[2, 3, 151000, 7], []]) == [0.5, 0.0]
