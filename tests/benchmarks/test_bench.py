"""`make bench` on the smallest settings: every section runs and the last line carries the ratios."""

import importlib.util
import json
import re
import subprocess
import sys

import pytest
from scripts.paths import REPO

from benchmarks.harness import core_share
from benchmarks.options import parse_args
from benchmarks.sections import colocate_memory, servers, tensor_parallel
from benchmarks.sections.overhead import parse_setting
from benchmarks.trainers import even_token_fraction

BENCH = REPO / "benchmarks" / "bench.py"

TINY = ["--preset", "tiny", "--populations", "2", "--batch_sizes", "2", "--model_sizes", "tiny", "--scale_model",
        "tiny", "--sections", "memory", "speed", "lowrank", "processes", "scale"]  # fmt: skip


@pytest.mark.slow
def test_bench_prints_every_ratio_on_its_last_line_and_writes_it_with_the_date_and_command(tmp_path):
    output = tmp_path / "results" / "bench.json"
    run = subprocess.run([sys.executable, str(BENCH), *TINY, "--output", str(output)], capture_output=True, text=True,
                         timeout=1800)  # fmt: skip
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
    # --output: the same result, with the date and the command that made it
    written = json.loads(output.read_text())
    assert {key: value for key, value in written.items() if key not in ("date", "command")} == result
    assert written["date"].startswith("20") and written["command"].endswith(f"--output {output}")
    assert written["settings"]["sections"] == TINY[TINY.index("--sections") + 1 :]
    assert "cpus_available" in written["machine"]


def test_presets_set_defaults_that_explicit_flags_override():
    assert parse_args([]).batch_size * parse_args([]).max_completion_length >= 1000  # the users' regime
    assert parse_args(["--preset", "gpu"]).memory_model == "0.5B"
    assert parse_args(["--preset", "gpu", "--batch_size", "4"]).batch_size == 4
    assert parse_args(["--full"]).preset == "full"


def test_the_sections_that_start_vllm_engines_and_servers_run_on_request():
    on_request = {"colocate_memory", "servers", "tensor_parallel"}
    assert on_request.isdisjoint(parse_args([]).sections)
    assert on_request <= set(parse_args(["--full"]).sections)
    assert parse_args(["--preset", "tiny"]).colocate_model == "tiny"


@pytest.mark.parametrize("section", [colocate_memory, servers, tensor_parallel])
def test_a_vllm_section_is_skipped_with_the_reason_where_vllm_is_not_installed(monkeypatch, section):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert section.run(parse_args(["--preset", "tiny"]), {}, "cpu") == {"skipped": "vLLM is not installed"}


def test_each_server_runs_on_its_own_share_of_the_cores(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert [core_share(index, 2) for index in range(2)] == ["0,1", "2,3"]
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {5})
    assert [core_share(index, 2) for index in range(2)] == ["5", "5"]  # fewer cores than servers: they share


def test_a_setting_is_population_by_batch_by_tokens():
    assert parse_setting("8x64x16") == (8, 64, 16)
    with pytest.raises(SystemExit, match="NxBxT"):
        parse_setting("64x16")


def test_the_token_reward_scores_any_vocabulary():
    assert even_token_fraction([[2, 3, 151000, 7], []]) == [0.5, 0.0]


@pytest.mark.parametrize(
    "script, variants, ratio",
    [
        ("resume_share_memory.py", ("share (TensorFiles)", "whole files (load_file)"), "resume_share_memory_ratio"),
        (
            "checkpoint_save_memory.py",
            ("each owner its share (trl-es)", "sent one at a time (on each node)", "gathered whole, then saved"),
            "checkpoint_save_memory_ratio",
        ),
        (
            "checkpoint_write_time.py",
            ("each owner its share (trl-es)", "sent one at a time (on each node)"),
            "checkpoint_write_time_ratio",
        ),
    ],
    ids=["resume", "checkpoint_save", "checkpoint_write_time"],
)
def test_a_split_master_benchmark_prints_every_variant_and_the_ratio(script, variants, ratio):
    command = [sys.executable, str(REPO / "benchmarks" / script), "--tensors", "4", "--rows", "64", "--cols", "64"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.splitlines()
    assert all(any(line.startswith(variant) for line in lines) for variant in variants)
    assert re.search(rf"{ratio} \(.* / .*\): \d+\.\d\d$", lines[-1])


def test_the_released_model_memory_benchmark_prints_every_setting_and_its_ratios():
    script = REPO / "benchmarks" / "released_model_memory.py"
    run = subprocess.run([sys.executable, str(script), "--hidden", "64", "--layers", "2"],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.splitlines()
    assert any(line.startswith("keeps the model") for line in lines)
    assert any(line.startswith("releases the model") for line in lines)
    assert any(re.search(r"released_model_resume_ratio \(reads its share / loads.*\): \d+\.\d\d$", x) for x in lines)
    assert any(line.startswith("rank 0 measures every rank's") for line in lines)
    assert any(re.search(r"released_model_evaluation_ratio \(holders measure.*\): \d+\.\d\d$", x) for x in lines)
    assert re.search(r"released_model_memory_ratio \(releases / keeps.*\): \d+\.\d\d$", lines[-1])


def test_the_master_memory_benchmark_finds_no_float32_copy_of_the_tensor_beside_the_drawn_noise():
    # The noise is drawn whole: a member holds its 4 bytes per element (and the 2 of its bfloat16 cast), an update 8
    # (the direction and one member's noise); the rest is done a slice of 1M elements at a time. Before 2026-12-07
    # the compensated master's update held 27 bytes per element, its member 12 and its centre 12 (this benchmark).
    script = REPO / "benchmarks" / "master_memory.py"
    run = subprocess.run([sys.executable, str(script), "--rows", "4096", "--cols", "2048"],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    keys = json.loads(run.stdout.splitlines()[-1].removeprefix("RESULT "))
    for master in ("float32", "compensated_bfloat16"):
        assert keys[f"master_member_bytes_per_element_{master}"] < 8, run.stdout
        assert keys[f"master_update_bytes_per_element_{master}"] < 10, run.stdout
    assert keys["master_centre_bytes_per_element_compensated_bfloat16"] < 1, run.stdout
