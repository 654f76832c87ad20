"""The coverage lab's command line and its run: sweep GRPO's learning rate, run every job, write the results file,
then the plots and the report from it (`--report`: only the last step)."""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, replace
from pathlib import Path

import experiments.coverage_lab
from experiments.coverage_lab.jobs import Job, run_job
from experiments.coverage_lab.report import write_report
from experiments.coverage_lab.settings import EQUAL, METHODS, WORKERS, LabSettings, equal_seconds, quick_settings
from experiments.coverage_lab.summary import summarize_runs
from experiments.harness import (
    add_common_arguments,
    add_worker_arguments,
    command_line,
    machine_info,
    markdown_path,
    resolve_work_dir,
    rewrite_report,
    run_jobs,
    seed_range,
    worker_count,
    write_results,
)

# The longest jobs first, so that the workers finish together.
TRAINING_ORDER = ("grpo", "es-then-grpo", "grpo-then-es", "es")


def run_lab(
    settings: LabSettings,
    output_dir: Path,
    markdown: Path,
    work_dir: Path,
    workers: int = WORKERS,
    threads: int = 1,
    command: str = "",
    log=print,
) -> dict:
    """Sweep GRPO's learning rate (unless given), train and measure every method and seed, write JSON, plots and
    Markdown; returns the results."""
    started = time.time()
    machine = machine_info()
    settings.grpo_steps  # noqa: B018 -- fails early when the budget does not split into whole steps
    grpo_lr, sweep = settings.grpo_learning_rate, []
    if grpo_lr is None:
        sweep_jobs = [
            Job("sweep", learning_rate=lr, work_dir=str(work_dir), settings=settings, threads=threads)
            for lr in settings.grpo_lr_sweep
        ]
        sweep = run_jobs(run_job, sweep_jobs, workers, "lab", log)
        grpo_lr = max(sweep, key=lambda entry: entry["final_reward"])["learning_rate"]
        log(f"[lab] GRPO learning rate from the sweep: {grpo_lr:g}")
    if settings.equal == "seconds":
        calibration = Job("calibrate", settings.seeds[0], grpo_lr, str(work_dir), settings, threads)
        [measured] = run_jobs(run_job, [calibration], 1, "lab", log)
        settings = equal_seconds(settings, measured["seconds_per_step"])
        log(f"[lab] CPU seconds per step {measured['seconds_per_step']}: {settings.es_steps} ES steps")
    jobs = [Job("base", work_dir=str(work_dir), settings=settings, threads=threads)]
    jobs += [
        Job(method, seed, grpo_lr, str(work_dir), settings, threads)
        for method in TRAINING_ORDER
        for seed in settings.seeds
    ]
    job_results = dict(zip((job.name for job in jobs), run_jobs(run_job, jobs, workers, "lab", log), strict=True))
    trained = [method for method in METHODS if method != "base"]
    runs = {"base": {seed: job_results["base"] for seed in settings.seeds[:1]}}
    runs |= {method: {seed: job_results[f"{method}-seed{seed}"] for seed in settings.seeds} for method in trained}
    results = {
        "command": command,
        "machine": machine,
        "workers": workers,
        "threads": threads,
        "settings": asdict(settings),
        "budget": settings.budget,
        "grpo_steps": settings.grpo_steps,
        "completions": {
            "es": settings.es_steps * settings.completions_per_es_step,
            "grpo": settings.grpo_steps * settings.completions_per_grpo_step,
        },
        "grpo_learning_rate": grpo_lr,
        "grpo_lr_sweep": [{k: v for k, v in entry.items() if k != "runtime_s"} for entry in sweep],
        "summary": summarize_runs(runs),
        "runs": runs,
        "job_runtimes_s": {f"sweep-lr{entry['learning_rate']:g}": entry["runtime_s"] for entry in sweep}
        | {name: result["runtime_s"] for name, result in job_results.items()},
        "runtime_s": time.time() - started,
    }
    log(f"[lab] wrote {write_results(output_dir, results)}")
    write_report(output_dir, markdown, log)
    return results


def es_variant_settings(name: str) -> dict:
    """The LabSettings fields of ES ablation variant `name`: its ESConfig changes (the lab keeps its own prompts per
    step and budget)."""
    from experiments.es_ablation.settings import VARIANTS

    if name not in VARIANTS:
        raise SystemExit(f"--es_variant {name!r} is not an ES ablation variant; use one of {', '.join(VARIANTS)}.")
    overrides = dict(VARIANTS[name].overrides)
    named = {"sigma": "sigma", "learning_rate": "es_learning_rate", "population_size": "population_size"}
    fields = {named[key]: overrides.pop(key) for key in list(overrides) if key in named}
    return {"es_variant": name, "es_overrides": overrides, **fields}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    defaults, quick = LabSettings(), quick_settings()
    description = experiments.coverage_lab.__doc__.split("\n\n")[0]
    parser = argparse.ArgumentParser(prog="python -m experiments.coverage_lab", description=description)
    add_common_arguments(parser, "lab", len(defaults.seeds), "docs/lab", "results.json and the PNGs")
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"A smoke test: {quick.es_steps} ES steps of {quick.population_size} members, "
        f"{quick.num_held_out} held-out problems, one worker.",
    )
    parser.add_argument(
        "--es_steps",
        type=int,
        default=None,
        help=f"ES steps (default {defaults.es_steps}, {quick.es_steps} with --quick; GRPO steps follow).",
    )
    parser.add_argument(
        "--equal",
        choices=EQUAL,
        default="completions",
        help="What every method gets the same of: completions (default), or measured training CPU seconds (those GRPO "
        "spends on the completion budget; ES gets the steps they buy). Use another --output_dir for each.",
    )
    parser.add_argument(
        "--es_variant",
        default="default",
        help="ES settings: a variant of the ES ablation (`python -m experiments.es_ablation`), e.g. the one it chose "
        "(default: the demo's settings).",
    )
    parser.add_argument(
        "--grpo_learning_rate",
        type=float,
        default=None,
        help="Skip the sweep (default: the best of "
        + ", ".join(f"{lr:g}" for lr in defaults.grpo_lr_sweep)
        + " on training reward) and use this lr.",
    )
    add_worker_arguments(parser, WORKERS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.report:
        return rewrite_report(args, write_report)
    seeds = seed_range(args.seeds)
    settings = quick_settings(seeds) if args.quick else LabSettings(seeds=seeds)
    if args.es_steps is not None:
        settings = replace(settings, es_steps=args.es_steps)
    if args.grpo_learning_rate is not None:
        settings = replace(settings, grpo_learning_rate=args.grpo_learning_rate)
    if args.equal == "seconds":
        settings = replace(settings, equal="seconds")
        args.lab += "-seconds"  # its own cached jobs (`resolve_work_dir`)
    if args.es_variant != "default":
        settings = replace(settings, **es_variant_settings(args.es_variant))
    workers = worker_count(args, WORKERS)
    command = command_line("experiments.coverage_lab", argv)
    return run_lab(
        settings, args.output_dir, markdown_path(args), resolve_work_dir(args), workers, args.threads, command
    )
