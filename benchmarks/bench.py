"""`make bench`'s entry point: `python benchmarks/bench.py [flags]`.

It reads the command line (`benchmarks/options.py`), builds the models the chosen sections need, runs the sections
(`benchmarks/sections/`) in order, prints the summary and, last, `RESULT <json>`; `--output PATH` also writes that
JSON to a file. With `--worker <spec>` it runs one memory measurement instead (section 1 starts each run in a fresh
process this way). What is measured and how: `python benchmarks/bench.py --help` (`benchmarks/__init__.py`).
"""

import json
import os
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

# Run as a script, Python puts benchmarks/ on sys.path; the `benchmarks` package needs the repository root.
REPOSITORY = str(Path(__file__).resolve().parents[1])
if REPOSITORY not in sys.path:
    sys.path.insert(0, REPOSITORY)

from benchmarks.harness import (  # noqa: E402
    MODEL_SIZES,
    machine_info,
    print_result,
    reply_to_parent,
    save_random_qwen2,
    write_result,
)
from benchmarks.options import parse_args  # noqa: E402
from benchmarks.sections import SECTIONS, overhead  # noqa: E402

# Every RESULT holds these (null where the section did not run), with the setting each one is measured at
REQUIRED_KEYS = {
    "overhead_ratio_es_over_generation": "speed: full-rank ES step / model.generate, users' regime (N, B, T)",
    "overhead_ratio_es_over_generation_small_batch": "speed: the same at --small_batch",
    "memory_ratio_es_over_grpo": "memory: bf16 weights + ES's float32 master vs GRPO on the bf16 model",
    "memory_ratio_es_over_grpo_fp32": "memory: float32 model, full-rank ES vs GRPO",
    "memory_ratio_lowrank_over_grpo": "memory: low-rank ES on the float32 model (its own master) vs GRPO in float32",
    "lowrank_ratio_over_batched_generation": "lowrank: low-rank ES step / one batched generate, largest N",
    "vllm_overhead_ratio": "vllm: colocate ES step / vLLM generation of the same completions",
    "speedup_2_processes": "processes: steps per second, 2 processes / 1",
    "memory_bytes_per_param_es_colocate": "colocate_memory: ES colocate (bf16 model, float32 master) - engine alone",
    "memory_bytes_per_param_es_colocate_compensated": "colocate_memory: the same, compensated_bfloat16 master",
    "memory_bytes_per_param_es_colocate_offloaded": "colocate_memory: the same, float32 master in host memory",
    "speedup_2_servers": "servers: ES steps per second, vllm_mode='server' over 2 servers / 1",
    "tp2_over_tp1_step_time_ratio": "tensor_parallel: colocate ES step, vLLM TP=2 / TP=1",
}
# Printed in the summary too, where measured
SECONDARY_KEYS = ("overhead_ratio_own_work", "vllm_overhead_ratio_own_work", "time_ratio_es_over_grpo_per_step",
                  "overhead_crosses_1_05_at_prompt_tokens", "speedup_2_processes_unsharded_update")  # fmt: skip


def main():
    cli = parse_args()
    if cli.worker:  # one measurement in this fresh process, for the section that started it
        spec = json.loads(cli.worker)
        reply_to_parent(SECTIONS[spec["section"]].worker(spec))
        return
    started = time.perf_counter()
    import torch

    device = cli.device if cli.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda, but torch sees no CUDA device. Use --device cpu (with --preset tiny to try).")
    if cli.bf16_model is None:
        cli.bf16_model = cli.memory_model if device == "cuda" else "5M"
    if cli.threads is None and device == "cpu":
        cli.threads = 1
    if cli.threads:
        torch.set_num_threads(cli.threads)
    workdir = Path(tempfile.mkdtemp(prefix="trl-es-bench-"))
    # Models, output dirs and every subprocess's temporary files go under `workdir`, removed at the end.
    tempfile.tempdir = os.environ["TMPDIR"] = str(workdir)
    try:
        result = run(cli, device, workdir, started)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if cli.output:
        command = " ".join(["python benchmarks/bench.py", *map(shlex.quote, sys.argv[1:])])
        print(f"wrote {write_result(cli.output, result, command)}", file=sys.stderr)


def run(cli, device: str, workdir: Path, started: float) -> dict:
    """Build the models, run the chosen sections, print the summary and the RESULT line; returns the result."""
    chosen = {name: module for name, module in SECTIONS.items() if name in cli.sections}
    sizes = set().union(*(module.model_sizes(cli) for module in chosen.values()))
    models = {size: save_random_qwen2(workdir / size, size) for size in sorted(sizes, key=list(MODEL_SIZES).index)}
    paths = {size: str(path) for size, (path, _) in models.items()}
    parameters = {size: count for size, (_, count) in models.items()}
    machine = machine_info(device)
    sizes_text = ", ".join(f"{size} = {count / 1e6:.1f}M parameters" for size, count in parameters.items())
    print(f"device {device}, {machine['cpus_available']} CPUs, torch {machine['torch']}, trl {machine['trl']}, load "
          f"average {machine['load_average'][0]:.1f}; preset {cli.preset}; random Qwen2 models: "
          f"{sizes_text}")  # fmt: skip
    print(f"users' regime: N={cli.population_size}, B={cli.batch_size}, T={cli.max_completion_length} (B x T = "
          f"{cli.batch_size * cli.max_completion_length} prompt-tokens per member step)")  # fmt: skip
    settings = {key: value for key, value in vars(cli).items() if key not in ("worker", "output")}
    result = {"benchmark": "bench", "machine": machine, "settings": {**settings, "parameters": parameters}}
    result.update(dict.fromkeys(REQUIRED_KEYS))
    skipped = {name: "not among --sections" for name in SECTIONS if name not in chosen}
    for name, module in chosen.items():
        outcome = result[name] = module.run(cli, paths, device)
        if "skipped" in outcome:
            print(f"skipped: {outcome['skipped']}")
            skipped[name] = outcome["skipped"]
        else:
            result.update(module.result_keys(outcome))
    result.update(overhead.grpo_time_ratio(result.get("memory"), result.get("speed")))
    result["skipped"] = {name: skipped[name] for name in SECTIONS if name in skipped}
    result["elapsed_seconds"] = time.perf_counter() - started
    print_summary(result)
    print_result(result)
    return result


def print_summary(result: dict) -> None:
    print(f"\n== Summary (elapsed {result['elapsed_seconds']:.0f} s) ==")
    for key, setting in REQUIRED_KEYS.items():
        value = result[key]
        shown = f"{value:.3f}" if isinstance(value, float) else "null"
        print(f"{key:48s}{shown:>8s}  {setting}")
    for key in SECONDARY_KEYS:
        if result.get(key) is not None:
            print(f"{key:48s}{result[key]:8.3f}")
    for name, reason in result["skipped"].items():
        print(f"skipped {name}: {reason.splitlines()[0][:200]}")


if __name__ == "__main__":
    main()
