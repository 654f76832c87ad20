"""The rubric lab's command line and its run: the gates of every pretraining seed's arms, every (model, method,
pretraining seed, training seed) job, the results file, then the plots and the report from it (`--report`: only the
last step)."""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, replace
from pathlib import Path

import experiments.rubric_lab
from experiments.harness import (
    add_common_arguments,
    command_line,
    machine_info,
    markdown_path,
    resolve_work_dir,
    rewrite_report,
    run_jobs,
    seed_range,
    write_results,
)
from experiments.rubric_lab.arms import lab_gates
from experiments.rubric_lab.jobs import Job, run_job
from experiments.rubric_lab.measuring import summarize
from experiments.rubric_lab.report import write_report
from experiments.rubric_lab.settings import METHODS, MODELS, RubricLabSettings, quick_settings
from experiments.rubric_lab.stats import lab_intervals
from trl_es.demo.pretrain import torch_threads


def run_lab(
    settings: RubricLabSettings, output_dir: Path, markdown: Path, work_dir: Path, command: str, workers: int = 1,
    log=print,
):  # fmt: skip
    """Train and measure every job (in this process, or in `workers` spawned ones; one torch thread and one judge
    each), write the results file, the plots and the report; returns the results."""
    started = time.time()
    machine = machine_info()
    jobs = [
        Job(model, method, pretraining_seed, seed, str(work_dir), settings)
        for model in settings.models
        for method in settings.methods
        for pretraining_seed in settings.pretraining_seeds
        for seed in settings.seeds
    ]
    unique = list({job.name: job for job in jobs}.values())  # the base model: one job for all training seeds
    with torch_threads(1):
        gates = lab_gates(settings, work_dir, log)
        outcomes = run_jobs(run_job, unique, workers, "rubric-lab", log)
    found = dict(zip((job.name for job in unique), outcomes, strict=True))
    runs = {model: {method: {} for method in settings.methods} for model in settings.models}
    for job in jobs:
        runs[job.model][job.method][f"{job.pretraining_seed}/{job.seed}"] = found[job.name]
    results = {
        "command": command,
        "machine": machine,
        "settings": asdict(settings),
        "gates": gates,
        "summary": summarize(runs),
        "intervals": lab_intervals(runs, settings.bootstrap_draws),
        "runs": runs,
        "runtime_s": time.time() - started,
    }
    log(f"[rubric-lab] wrote {write_results(output_dir, results)}")
    write_report(output_dir, markdown, log)
    return results


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    description = experiments.rubric_lab.__doc__.split("\n\n")[0]
    parser = argparse.ArgumentParser(prog="python -m experiments.rubric_lab", description=description)
    add_common_arguments(
        parser, "rubric-lab", len(RubricLabSettings().seeds), "docs/rubric_lab", "results.json and the plot"
    )
    parser.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(METHODS))
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument(
        "--pretraining_seeds",
        type=int,
        default=len(RubricLabSettings().pretraining_seeds),
        help="Number of pretraining seeds, i.e. pairs of arms (0: the shipped ones; the others are pretrained into "
        "the work folder first, about an hour of one core each; default %(default)s).",
    )
    parser.add_argument("--workers", type=int, default=1, help="Jobs run at once, one process and core each.")
    parser.add_argument("--quick", action="store_true", help="A smoke test: short phases, one seed.")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.report:
        return rewrite_report(args, write_report)
    if args.quick:
        settings = quick_settings()
    else:
        settings = RubricLabSettings(
            pretraining_seeds=seed_range(args.pretraining_seeds), seeds=seed_range(args.seeds)
        )
    settings = replace(settings, methods=tuple(args.methods), models=tuple(args.models))
    command = command_line("experiments.rubric_lab", argv)
    work_dir = resolve_work_dir(args)
    return run_lab(settings, args.output_dir, markdown_path(args), work_dir, command, args.workers)
