"""ES steps per second with 1 and 2 processes on the same work, side by side in one run.

    python benchmarks/population_parallel.py                 # tiny local model, CPU (gloo): about 2 minutes
    python benchmarks/population_parallel.py --processes 1 8 --model Qwen/Qwen2.5-0.5B-Instruct --use_vllm
    python benchmarks/population_parallel.py --processes 1 --use_vllm --compare_tensor_parallel   # TP=2 vs TP=1

Every run trains the same steps (same members, prompts and seeds: the weights end bitwise identical); with P
processes each evaluates population_size / P members. The last line is `RESULT <json>`.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

# Run as a script (also by `accelerate launch`), Python puts benchmarks/ on sys.path; `benchmarks` needs the root.
REPOSITORY = Path(__file__).resolve().parents[1]
if str(REPOSITORY) not in sys.path:
    sys.path.insert(0, str(REPOSITORY))

from benchmarks.harness import ACCELERATE_LAUNCH, median, print_result  # noqa: E402
from benchmarks.trainers import ES_PHASES  # noqa: E402

CONFIGS = REPOSITORY / "examples" / "accelerate_configs"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="Model path or id (default: the tiny model, built locally).")
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--population_size", type=int, default=8)
    parser.add_argument("--batch_size", type=int, default=16, help="Prompts per ES step, over all processes.")
    parser.add_argument("--max_completion_length", type=int, default=32)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--use_vllm", action="store_true", help="One colocated vLLM engine per process.")
    parser.add_argument(
        "--compare_tensor_parallel",
        action="store_true",
        help="With --use_vllm: also run 2 processes sharing one engine (vllm_tensor_parallel_size=2).",
    )
    parser.add_argument("--tensor_parallel_size", type=int, default=1, help=argparse.SUPPRESS)  # a worker's setting
    parser.add_argument(
        "--compare_shard_update",
        action="store_true",
        help="Also run every multi-process setting with `shard_update=False` (each process draws all of the update).",
    )
    parser.add_argument("--no_shard_update", action="store_true", help=argparse.SUPPRESS)  # a worker's setting
    parser.add_argument("--worker_output", default=None, help=argparse.SUPPRESS)  # set when launched as a worker
    return parser.parse_args(argv)


def worker(cli):
    """One training run under `accelerate launch`; the main process writes its measured seconds per step."""
    import torch

    from trl_es import ESConfig, ESTrainer
    from trl_es.testing import digit_fraction, digit_prompts

    processes = int(os.environ.get("WORLD_SIZE", 1))
    args = ESConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-es-bench-"),
        population_size=cli.population_size,
        per_device_train_batch_size=cli.batch_size // processes,
        max_completion_length=cli.max_completion_length,
        temperature=1.0,
        sigma=0.05,
        learning_rate=0.01,
        max_steps=cli.steps + 1,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        use_cpu=True,
        use_vllm=cli.use_vllm,
        vllm_mode="colocate",
        vllm_tensor_parallel_size=cli.tensor_parallel_size,
        shard_update=not cli.no_shard_update,
    )
    dataset = digit_prompts(cli.batch_size * (cli.steps + 1))
    trainer = ESTrainer(model=cli.model, reward_funcs=digit_fraction, args=args, train_dataset=dataset)
    trainer.train()
    if trainer.accelerator.is_main_process:
        history = trainer.state.log_history[1:]  # skip the warm-up step
        phases = {phase: [h[f"es/time/{phase}"] for h in history if f"es/time/{phase}" in h] for phase in ES_PHASES}
        step_times = [h["step_time"] for h in history if "step_time" in h]
        timing = {"processes": processes, "torch_threads": torch.get_num_threads(), "step_times": step_times, **phases}
        timing["tensor_parallel_size"] = cli.tensor_parallel_size
        Path(cli.worker_output).write_text(json.dumps(timing))
    trainer.accelerator.wait_for_everyone()
    trainer.accelerator.end_training()  # a rank that exits while gloo threads still run aborts


def main():
    cli = parse_args()
    if cli.worker_output:
        return worker(cli)
    if cli.model is None:
        from trl_es.testing import PEAKED_INITIALIZER_RANGE, save_tiny_model

        cli.model = str(save_tiny_model(tempfile.mkdtemp() + "/tiny", initializer_range=PEAKED_INITIALIZER_RANGE))
    environment = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    settings = [(processes, True, 1) for processes in cli.processes]
    if cli.compare_shard_update:
        settings += [(processes, False, 1) for processes in cli.processes if processes > 1]
    if cli.compare_tensor_parallel:
        settings.append((2, True, 2))
    rows = []
    for processes, shard_update, tensor_parallel in settings:
        output = Path(tempfile.mkdtemp()) / "timing.json"
        config = CONFIGS / ("single_gpu.yaml" if processes == 1 else "multi_gpu.yaml")
        command = [
            *ACCELERATE_LAUNCH,
            *("--config_file", str(config), "--num_processes", str(processes), __file__),
            *("--model", cli.model, "--population_size", str(cli.population_size), "--steps", str(cli.steps)),
            *("--batch_size", str(cli.batch_size), "--max_completion_length", str(cli.max_completion_length)),
            *("--worker_output", str(output), *(["--use_vllm"] if cli.use_vllm else [])),
            *([] if shard_update else ["--no_shard_update"]),
            *("--tensor_parallel_size", str(tensor_parallel)),
        ]
        subprocess.run(command, check=True, env=environment, capture_output=True)
        timing = json.loads(output.read_text())
        seconds = median(timing["step_times"])
        phases = {phase: median(timing[phase]) for phase in ES_PHASES}
        phases["other"] = seconds - sum(phases.values())  # gathers, tokenising, logging, the agreement check
        rows.append({"processes": processes, "shard_update": shard_update, "tensor_parallel_size": tensor_parallel,
                     "torch_threads": timing["torch_threads"], "seconds_per_step": seconds,
                     "steps_per_second": 1 / seconds, "phases": phases})  # fmt: skip
    base = rows[0]["steps_per_second"]
    print(f"N={cli.population_size}, B={cli.batch_size}, {cli.max_completion_length} new tokens, model {cli.model}")
    print("phases: the main process's seconds per step (medians); `other` is the rest of the step")
    print(f"{'processes':>10s}{'sharded':>8s}{'TP':>4s}{'threads':>8s}{'s/step':>9s}{'steps/s':>9s}{'speedup':>9s}"
          + "".join(f"{phase:>10s}" for phase in [*ES_PHASES, "other"]))  # fmt: skip
    for row in rows:
        row["speedup"] = row["steps_per_second"] / base
        sharded = "-" if row["processes"] == 1 else "yes" if row["shard_update"] else "no"
        print(f"{row['processes']:>10d}{sharded:>8s}{row['tensor_parallel_size']:>4d}{row['torch_threads']:>8d}"
              f"{row['seconds_per_step']:>9.3f}"
              f"{row['steps_per_second']:>9.3f}{row['speedup']:>9.2f}"
              + "".join(f"{row['phases'][phase]:>10.3f}" for phase in [*ES_PHASES, "other"]))  # fmt: skip
    print_result({"benchmark": "population_parallel", "runs": rows})


if __name__ == "__main__":
    main()
