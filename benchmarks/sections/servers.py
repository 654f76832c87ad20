"""Section 8, servers (`--sections servers`, not run by default): `benchmarks/server_pool_speedup.py`, ES steps per
second with `vllm_mode="server"` over 2 `trl-es vllm-serve` servers against 1, at the users' N, B and T on
`--servers_model`: `speedup_2_servers`. On CPU each server's engine runs on its own half of the cores, so the 1-server
setting uses half the machine; on 2 CPU cores the trainer process and the servers' API processes share those cores
with the engines."""

from __future__ import annotations

import importlib.util

from benchmarks.harness import cpus_available, run_benchmark_script


def model_sizes(cli) -> set[str]:
    return {cli.servers_model}


def run(cli, paths: dict[str, str], device: str) -> dict:
    print("\n== 8. vLLM servers (benchmarks/server_pool_speedup.py) ==")
    if importlib.util.find_spec("vllm") is None:
        return {"skipped": "vLLM is not installed"}
    import torch

    if device == "cuda" and torch.cuda.device_count() < 2:
        return {"skipped": f"2 servers need 2 GPUs; this machine has {torch.cuda.device_count()}"}
    if device == "cpu" and cpus_available() < 2:
        return {"skipped": f"2 servers need 2 CPU cores; this process may use {cpus_available()}"}
    arguments = ["--model", paths[cli.servers_model], "--population_size", str(cli.population_size),
                 "--batch_size", str(cli.batch_size), "--max_completion_length", str(cli.max_completion_length),
                 "--steps", str(cli.servers_steps), "--repetitions", str(cli.repetitions),
                 *(["--cuda"] if device == "cuda" else [])]  # fmt: skip
    return run_benchmark_script("server_pool_speedup.py", arguments, "servers")


def result_keys(outcome: dict) -> dict:
    return {"speedup_2_servers": outcome["speedup_2_servers"]}
