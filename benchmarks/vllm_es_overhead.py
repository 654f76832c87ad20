"""ES step with vLLM vs plain vLLM generation of the same completions, measured side by side in one run.

    python benchmarks/vllm_es_overhead.py                      # colocate, N=8, on the tiny local model (CPU: ~1 min)
    python benchmarks/vllm_es_overhead.py --population_size 30 --model Qwen/Qwen2.5-0.5B-Instruct

One ES step generates N x B completions (N members, B prompts) and also writes each member's weights into the engine,
scores, updates the master and checks the engine against it. The baseline generates the same N x B completions with
the same call pattern (N calls of B rows, same seeds) and fixed weights. The ratio is the ES overhead. The last line
is `RESULT <json>`.
"""

import argparse
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
# Run as a script, Python puts benchmarks/ on sys.path; the `benchmarks` package needs the repository root.
REPOSITORY = str(Path(__file__).resolve().parents[1])
if REPOSITORY not in sys.path:
    sys.path.insert(0, REPOSITORY)

from benchmarks.harness import interleaved, medians, print_result, timed  # noqa: E402
from benchmarks.trainers import es_own_work_seconds, es_phases, es_step_seconds, quiet  # noqa: E402


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="Model path or id (default: the tiny model, built locally).")
    parser.add_argument("--population_size", type=int, default=8)
    parser.add_argument("--batch_size", type=int, default=16, help="Prompts per ES step (B).")
    parser.add_argument("--max_completion_length", type=int, default=32)
    parser.add_argument("--steps", type=int, default=5, help="Measured ES steps, each followed by the baseline.")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--consistency_check_steps", type=int, default=1)
    parser.add_argument("--cuda", action="store_true", help="Train and generate on the GPU (default: CPU).")
    return parser.parse_args()


def main():
    cli = parse_args()
    from trl_es import ESConfig, ESTrainer
    from trl_es.core.noise import sampling_seed
    from trl_es.testing import PEAKED_INITIALIZER_RANGE, digit_fraction, digit_prompts, save_tiny_model

    workdir = tempfile.mkdtemp(prefix="trl-es-bench-")
    model = cli.model or str(save_tiny_model(f"{workdir}/tiny", initializer_range=PEAKED_INITIALIZER_RANGE))
    dataset = digit_prompts(cli.batch_size * cli.warmup)
    args = ESConfig(
        output_dir=f"{workdir}/run",
        use_vllm=True,
        vllm_mode="colocate",
        population_size=cli.population_size,
        per_device_train_batch_size=cli.batch_size,
        max_completion_length=cli.max_completion_length,
        temperature=1.0,
        sigma=0.05,
        learning_rate=0.01,
        max_steps=cli.warmup,
        logging_steps=1,
        consistency_check_steps=cli.consistency_check_steps,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        use_cpu=not cli.cuda,
    )
    trainer = quiet(ESTrainer(model=model, reward_funcs=digit_fraction, args=args, train_dataset=dataset))
    trainer.train()  # warm-up steps through the Trainer loop; they also create the master and the backend

    # Interleave ES steps and the baseline so that both see the same machine load.
    backend = trainer.population.backend
    prompts = dataset["prompt"][: cli.batch_size]
    prompt_ids = [trainer.processing_class(prompt)["input_ids"] for prompt in prompts]
    seed = sampling_seed(args.seed, trainer.state.global_step)

    def generate_population():  # the same N calls of B rows and seeds as a step, weights fixed
        for _member in range(cli.population_size):
            backend.generate_center(prompt_ids, trainer.sampling, seed)

    times = interleaved(
        cli.steps,
        {"es_step": lambda: es_step_seconds(trainer, prompts), "generation": lambda: timed(generate_population)},
    )
    median_seconds = medians(times)
    es_step, generation = median_seconds["es_step"], median_seconds["generation"]
    phases = es_phases(trainer, cli.steps)  # the measured steps' phase timings (not yet flushed to a log)
    ratio = es_step / generation
    own_work = es_own_work_seconds(trainer, times["es_step"])
    completions = cli.population_size * cli.batch_size
    print(f"model {model}, N={cli.population_size}, B={cli.batch_size}, {cli.max_completion_length} new tokens")
    print(f"{'':40s}{'seconds':>10s}")
    print(f"{'ES step (median)':40s}{es_step:10.3f}")
    print(f"{'  of which writing member weights':40s}{phases['perturb']:10.3f}")
    print(f"{'  of which generating':40s}{phases['generate']:10.3f}")
    print(f"{'  of which scoring':40s}{phases['reward']:10.3f}")
    print(f"{'  of which updating the master':40s}{phases['update']:10.3f}")
    print(f"{f'vLLM generating {completions} completions':40s}{generation:10.3f}")
    print(f"{'overhead ratio (ES step / generation)':40s}{ratio:10.3f}")
    print(f"{'ES own work (step - its generation)':40s}{own_work:10.3f}")
    print(f"{'1 + own work / generation':40s}{1 + own_work / generation:10.3f}")
    result = {
        "benchmark": "vllm_es_overhead",
        "mode": "colocate",
        "population_size": cli.population_size,
        "batch_size": cli.batch_size,
        "max_completion_length": cli.max_completion_length,
        "es_step_seconds": es_step,
        "generation_seconds": generation,
        "overhead_ratio_es_over_generation": ratio,
        "es_own_work_seconds": own_work,
        "overhead_ratio_own_work": 1 + own_work / generation,
    }
    print_result(result)


if __name__ == "__main__":
    main()
