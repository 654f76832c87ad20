"""The ablation's command line and its run: every (variant, seed) job, the results file, then the report from it
(`--report`: only the last step)."""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, replace
from pathlib import Path

import experiments.es_ablation
from experiments.es_ablation.jobs import Job, run_job
from experiments.es_ablation.report import write_report
from experiments.es_ablation.settings import VARIANTS, AblationSettings, quick_settings
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

WORKERS = 2


def run_ablation(
    settings: AblationSettings,
    output_dir: Path,
    markdown: Path,
    work_dir: Path,
    workers: int = WORKERS,
    threads: int = 1,
    command: str = "",
    log=print,
) -> dict:
    """Train and measure every variant and seed, write the results file and the report; returns the results."""
    started = time.time()
    machine = machine_info()
    # The costliest runs first (the measurements cost the same for all), so that the workers finish together.
    jobs = [
        Job(variant, seed, str(work_dir), settings, threads)
        for variant in sorted(settings.variants, key=lambda name: -settings.steps(VARIANTS[name]))
        for seed in settings.seeds
    ]
    job_results = dict(zip((job.name for job in jobs), run_jobs(run_job, jobs, workers, "ablation", log), strict=True))
    runs = {
        variant: {str(seed): job_results[f"{variant}-seed{seed}"] for seed in settings.seeds}
        for variant in settings.variants
    }
    results = {
        "command": command,
        "machine": machine,
        "workers": workers,
        "threads": threads,
        "settings": asdict(settings),
        "variants": {name: asdict(VARIANTS[name]) | {"steps": settings.steps(VARIANTS[name])} for name in runs},
        "runs": runs,
        "job_runtimes_s": {name: result["runtime_s"] for name, result in job_results.items()},
        "runtime_s": time.time() - started,
    }
    log(f"[ablation] wrote {write_results(output_dir, results)}")
    write_report(output_dir, markdown, log)
    return results


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    defaults = AblationSettings()
    description = experiments.es_ablation.__doc__.split("\n\n")[0]
    parser = argparse.ArgumentParser(prog="python -m experiments.es_ablation", description=description)
    add_common_arguments(parser, "ablation", len(defaults.seeds), "docs/ablation", "results.json and the PNG")
    parser.add_argument("--quick", action="store_true", help="A smoke test: a few steps and problems, one worker.")
    parser.add_argument(
        "--variants",
        nargs="+",
        choices=list(VARIANTS),
        default=None,
        help="Run only these variants (default: all; the default settings' runs are always included).",
    )
    add_worker_arguments(parser, WORKERS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.report:
        return rewrite_report(args, write_report)
    seeds = seed_range(args.seeds)
    settings = quick_settings(seeds) if args.quick else AblationSettings(seeds=seeds)
    if args.variants:
        settings = replace(settings, variants=tuple(dict.fromkeys(["default", *args.variants])))
    workers = worker_count(args, WORKERS)
    command = command_line("experiments.es_ablation", argv)
    return run_ablation(
        settings, args.output_dir, markdown_path(args), resolve_work_dir(args), workers, args.threads, command
    )
