"""`make bench` on the smallest settings: every section runs and the last line carries the ratios."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parent.parent / "benchmarks" / "bench.py"
TINY = ["--memory_model", "5M", "--population_size", "2", "--batch_size", "2", "--max_completion_length", "4",
        "--steps", "1", "--repetitions", "1", "--lowrank_populations", "2", "--populations", "2", "--batch_sizes", "2",
        "--model_sizes", "5M", "--sections", "memory", "speed", "lowrank", "scale"]  # fmt: skip


@pytest.mark.slow
def test_bench_prints_every_ratio_on_its_last_line():
    run = subprocess.run([sys.executable, str(BENCH), *TINY], capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    last = run.stdout.strip().splitlines()[-1]
    assert last.startswith("RESULT ")
    result = json.loads(last[len("RESULT ") :])
    for key in ("memory_ratio_es_over_grpo", "overhead_ratio_es_over_generation", "time_ratio_es_over_grpo_per_step",
                "lowrank_ratio_es_over_generation_n2", "fullrank_ratio_es_over_batched_generation_n2",
                "memory_ratio_es_lowrank_over_grpo"):  # fmt: skip
        assert result[key] > 0, key
    # ES keeps no gradients and no optimizer state: it adds less memory than GRPO's AdamW step on the same model.
    assert result["memory_ratio_added_es_over_grpo"] < 1
    assert [row["population_size"] for row in result["scale"]["population_size"]] == [2]
