"""Section 5, processes: `benchmarks/population_parallel.py`, steps per second of 2 processes over 1:
`speedup_2_processes`, and `speedup_2_processes_unsharded_update`, the same with `shard_update=False` side by side
(each process then draws all of the update's noise)."""

from __future__ import annotations

from benchmarks.harness import cpus_available, run_benchmark_script


def model_sizes(cli) -> set[str]:
    return {cli.processes_model}


def run(cli, paths: dict[str, str], device: str) -> dict:
    print("\n== 5. Processes (benchmarks/population_parallel.py) ==")
    import torch

    if device == "cuda" and torch.cuda.device_count() < 2:
        return {"skipped": f"2 processes need 2 GPUs; this machine has {torch.cuda.device_count()}"}
    if device == "cpu" and cpus_available() < 2:
        return {"skipped": f"2 processes need 2 CPU cores; this process may use {cpus_available()}"}
    arguments = ["--model", paths[cli.processes_model], "--population_size", str(cli.population_size),
                 "--batch_size", str(cli.batch_size), "--max_completion_length", str(cli.max_completion_length),
                 "--steps", str(max(cli.repetitions, 2)), "--compare_shard_update"]  # fmt: skip
    outcome = run_benchmark_script("population_parallel.py", arguments, "processes")
    if "skipped" not in outcome:
        for key, shard_update in (("speedup_2_processes", True), ("speedup_2_processes_unsharded_update", False)):
            two = [row for row in outcome["runs"] if row["processes"] == 2 and row["shard_update"] == shard_update]
            outcome[key] = two[0]["speedup"] if two else None
    return outcome


def result_keys(outcome: dict) -> dict:
    return {key: outcome[key] for key in ("speedup_2_processes", "speedup_2_processes_unsharded_update")}
