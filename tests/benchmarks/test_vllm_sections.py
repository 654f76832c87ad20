"""`make bench`'s vLLM sections at the tiny preset, in one run: `servers` starts two real `trl-es vllm-serve` servers
and times ES steps over one and over both; `colocate_memory` measures ES colocate processes and an engine-only
process; `tensor_parallel` times 2 processes sharing a TP=2 engine against 1 process with its own. And
`benchmarks/vllm_engine_start.py`, the engine's start three ways."""

import json
import os
import re
import subprocess
import sys

import pytest
from scripts.paths import REPO
from scripts.server_vllm_required import require_module

require_module("vllm")

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

BENCH = REPO / "benchmarks" / "bench.py"


@pytest.fixture(scope="module")
def result() -> dict:
    sections = ["servers", "colocate_memory", "tensor_parallel"]
    # `make bench` as users run it, on vLLM's default compile path: tests/conftest.py turns AOT compilation off for
    # the suite's own engines, and with it off the tiny model's colocate_memory measured ES adding less than nothing.
    environment = {name: value for name, value in os.environ.items() if name != "VLLM_USE_AOT_COMPILE"}
    run = subprocess.run([sys.executable, str(BENCH), "--preset", "tiny", "--sections", *sections],
                         capture_output=True, text=True, timeout=1800, env=environment)  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1].removeprefix("RESULT "))


def test_servers_times_es_steps_over_one_real_server_and_over_two(result):
    assert "servers" not in result["skipped"]
    runs = result["servers"]["runs"]
    assert [row["servers"] for row in runs] == [1, 2]
    assert all(row["step_seconds"] and min(row["step_seconds"]) > 0 for row in runs)
    assert result["speedup_2_servers"] == runs[1]["steps_per_second"] / runs[0]["steps_per_second"]


def test_colocate_memory_measures_what_es_adds_to_the_same_engine_for_each_master(result):
    outcome = result["colocate_memory"]
    runs = outcome["es"]
    float32, compensated, offloaded = runs["float32"], runs["compensated_bfloat16"], runs["float32, host"]
    assert all(es["engines_alike"] for es in runs.values())  # the engine-only baseline is ES's engine
    assert float32["engine"]["dtype"] == "bfloat16"
    # What the trainer holds beside the engine: the bf16 model and a float32 master, or the compensated residual;
    # on the CPU the host master is held where the accelerator's would be.
    assert float32["held_bytes_per_param"] == offloaded["held_bytes_per_param"] == 6
    assert compensated["held_bytes_per_param"] == 4
    for es in runs.values():
        assert es["added_bytes"] >= es["model_bytes"] + es["master_bytes"]
    assert result["memory_bytes_per_param_es_colocate"] == float32["bytes_per_param"]
    assert result["memory_bytes_per_param_es_colocate_compensated"] == compensated["bytes_per_param"]
    assert result["memory_bytes_per_param_es_colocate_offloaded"] == offloaded["bytes_per_param"]
    assert result["skipped"]["speed"] == "not among --sections"  # only the sections asked for ran


def test_tensor_parallel_times_two_processes_sharing_one_engine_against_one_with_its_own(result):
    runs = result["tensor_parallel"]["runs"]
    assert [(row["processes"], row["tensor_parallel_size"]) for row in runs] == [(1, 1), (2, 2)]
    assert all(row["seconds_per_step"] > 0 for row in runs)
    assert result["tp2_over_tp1_step_time_ratio"] == runs[1]["seconds_per_step"] / runs[0]["seconds_per_step"]


def test_the_engine_start_benchmark_starts_an_engine_each_way_and_prints_the_ratio():
    script = REPO / "benchmarks" / "vllm_engine_start.py"
    run = subprocess.run([sys.executable, str(script), "--repetitions", "1", "--warmup_rounds", "0"],
                         capture_output=True, text=True, timeout=900)  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    lines = run.stdout.splitlines()
    for way in ("default (AOT compile)", "VLLM_USE_AOT_COMPILE=0", "enforce_eager=True"):
        assert any(re.match(rf"{re.escape(way)} +\d+\.\d\d +\d+\.\d\d$", line) for line in lines), way
    assert re.search(r"vllm_engine_start_ratio \(VLLM_USE_AOT_COMPILE=0 / default\): \d+\.\d\d$", lines[-1])
