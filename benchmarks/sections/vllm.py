"""Section 4, vLLM colocate: `benchmarks/vllm_es_overhead.py` at the users' N, B and T, an ES step against vLLM
generation of the same completions: `vllm_overhead_ratio`."""

from __future__ import annotations

import importlib.util

from benchmarks.harness import run_benchmark_script


def model_sizes(cli) -> set[str]:
    return set()  # the script builds its own model (or takes --vllm_model)


def run(cli, paths: dict[str, str], device: str) -> dict:
    print("\n== 4. vLLM colocate (benchmarks/vllm_es_overhead.py) ==")
    if importlib.util.find_spec("vllm") is None:
        return {"skipped": "vLLM is not installed"}
    arguments = ["--steps", str(cli.repetitions), "--warmup", "1", "--population_size", str(cli.population_size),
                 "--batch_size", str(cli.batch_size), "--max_completion_length", str(cli.max_completion_length),
                 *(["--model", cli.vllm_model] if cli.vllm_model else []),
                 *(["--cuda"] if device == "cuda" else [])]  # fmt: skip
    outcome = run_benchmark_script("vllm_es_overhead.py", arguments, "vLLM")
    if "skipped" not in outcome:
        outcome["vllm_overhead_ratio"] = outcome["overhead_ratio_es_over_generation"]
    return outcome


def result_keys(outcome: dict) -> dict:
    ratio = outcome["vllm_overhead_ratio"]
    return {"vllm_overhead_ratio": ratio, "overhead_ratio_es_over_generation_vllm": ratio,
            "vllm_overhead_ratio_own_work": outcome["overhead_ratio_own_work"]}  # fmt: skip
