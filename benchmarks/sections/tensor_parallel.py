"""Section 9, tensor_parallel (not run by default): `benchmarks/population_parallel.py` with colocated vLLM, one
process with its own engine against two processes sharing one engine (`vllm_tensor_parallel_size=2`, one evaluator
with the master split between them), the same members and prompts: `tp2_over_tp1_step_time_ratio`, seconds per ES
step with TP=2 / TP=1."""

from __future__ import annotations

import importlib.util

from benchmarks.harness import cpus_available, run_benchmark_script


def model_sizes(cli) -> set[str]:
    return set()  # the script builds trl_es.testing's tiny model: 2 attention heads, which TP=2 needs


def run(cli, paths: dict[str, str], device: str) -> dict:
    print("\n== 9. Tensor-parallel engine (benchmarks/population_parallel.py --compare_tensor_parallel) ==")
    if importlib.util.find_spec("vllm") is None:
        return {"skipped": "vLLM is not installed"}
    if device == "cuda":
        return {"skipped": "the script trains on the CPU (gloo ranks); a GPU run is not built"}
    if cpus_available() < 2:
        return {"skipped": f"2 processes need 2 CPU cores; this process may use {cpus_available()}"}
    arguments = ["--processes", "1", "--use_vllm", "--compare_tensor_parallel",
                 "--population_size", str(cli.population_size), "--batch_size", str(cli.batch_size),
                 "--max_completion_length", str(cli.max_completion_length),
                 "--steps", str(max(cli.repetitions, 2))]  # fmt: skip
    outcome = run_benchmark_script("population_parallel.py", arguments, "tensor-parallel")
    if "skipped" not in outcome:
        [one] = [row for row in outcome["runs"] if row["tensor_parallel_size"] == 1]
        [two] = [row for row in outcome["runs"] if row["tensor_parallel_size"] == 2]
        outcome["tp2_over_tp1_step_time_ratio"] = two["seconds_per_step"] / one["seconds_per_step"]
    return outcome


def result_keys(outcome: dict) -> dict:
    return {"tp2_over_tp1_step_time_ratio": outcome["tp2_over_tp1_step_time_ratio"]}
