"""The rubric lab's command line and its run: every (model, method, seed) job, the results file, then the plot and
the report from it (`--report`: only the last step)."""

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
from experiments.rubric_lab.jobs import Job, run_job
from experiments.rubric_lab.measuring import summarize
from experiments.rubric_lab.report import write_report
from experiments.rubric_lab.settings import METHODS, MODELS, RubricLabSettings, quick_settings


def run_lab(settings: RubricLabSettings, output_dir: Path, markdown: Path, work_dir: Path, command: str, log=print):
    """Train and measure every job in this process (one torch thread, one judge), write the results file, the plot
    and the report; returns the results."""
    import torch

    started = time.time()
    machine = machine_info()
    torch.set_num_threads(1)
    gates = lab_gates(settings, log)
    jobs = [
        Job(model, method, seed, str(work_dir), settings)
        for model in settings.models
        for method in settings.methods
        for seed in settings.seeds
    ]
    runs = {model: {method: {} for method in settings.methods} for model in settings.models}
    for job, result in zip(jobs, run_jobs(run_job, jobs, 1, "rubric-lab", log), strict=True):
        runs[job.model][job.method][job.seed] = result
    results = {
        "command": command,
        "machine": machine,
        "settings": asdict(settings),
        "gates": gates,
        "summary": summarize(runs),
        "runs": runs,
        "runtime_s": time.time() - started,
    }
    log(f"[rubric-lab] wrote {write_results(output_dir, results)}")
    write_report(output_dir, markdown, log)
    return results


def lab_gates(settings: RubricLabSettings, log=print) -> dict:
    """The shipped arms' gates, measured before any job on the demo's training questions (at least its 256, of which
    the jobs train on the first `num_train`); a failed gate stops the lab before it trains anything."""
    from trl_es.demo.evolm.gates import check_gates, format_gates
    from trl_es.demo.evolm.run import measure_gates
    from trl_es.demo.evolm.settings import EVOLM_DEMO

    questions = max(settings.demo.num_train, EVOLM_DEMO.num_train)
    measured, found = measure_gates(settings.demo)
    log(f"[rubric-lab] gates, on {questions} training questions:\n{format_gates(found)}")
    check_gates(found)
    return {"num_questions": questions, "measured": measured, "gates": [asdict(gate) for gate in found]}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    description = experiments.rubric_lab.__doc__.split("\n\n")[0]
    parser = argparse.ArgumentParser(prog="python -m experiments.rubric_lab", description=description)
    add_common_arguments(
        parser, "rubric-lab", len(RubricLabSettings().seeds), "docs/rubric_lab", "results.json and the plot"
    )
    parser.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(METHODS))
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--quick", action="store_true", help="A smoke test: short phases, one seed.")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.report:
        return rewrite_report(args, write_report)
    settings = quick_settings() if args.quick else RubricLabSettings(seeds=seed_range(args.seeds))
    settings = replace(settings, methods=tuple(args.methods), models=tuple(args.models))
    command = command_line("experiments.rubric_lab", argv)
    return run_lab(settings, args.output_dir, markdown_path(args), resolve_work_dir(args), command)
