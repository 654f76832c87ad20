"""The agent demo over seeds: `trl-es demo --task tools` with ES seeds 0, 1 and 2, and its held-out episodes before and
after as the mean and standard error over seeds, written to docs/tools_demo/results.json and docs/tools_demo.md.

    python -m experiments.tools_demo            # the three demo runs, one after the other
    python -m experiments.tools_demo --report   # only redraw docs/tools_demo.md from results.json

Each run is exactly `trl-es demo --task tools --seed S` (`trl_es.demo.tools.run_tools_demo`): the seed sets the
members' noise and the order of the training questions; the held-out episodes (questions and the prices drawn at each
reset, `trl_es.demo.tools.EPISODE_SEED`) and the greedy evaluation are the same for every seed, so the "before" column
has no spread.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import asdict
from pathlib import Path
from typing import NamedTuple

from experiments.harness import (
    add_common_arguments,
    cached_job,
    command_line,
    machine_info,
    markdown_path,
    markdown_table,
    read_results,
    resolve_work_dir,
    rewrite_report,
    run_jobs,
    seed_range,
    spread,
    write_results,
)
from trl_es.demo.tools import LABELS, MEASURED, TOOLS_DEMO, run_tools_demo

MODULE = "experiments.tools_demo"


class Job(NamedTuple):
    name: str
    seed: int
    max_steps: int
    num_held_out: int
    folder: Path


def run_job(job: Job) -> dict:
    def compute() -> dict:
        result = run_tools_demo(
            str(job.folder / "model"), job.max_steps, job.seed, job.num_held_out, log=lambda *args: None
        )
        return {"seed": job.seed, "before": result.before, "after": result.after}

    return cached_job(job.folder, compute)


def standard_error(values: list[float]) -> dict:
    """The mean over seeds, its standard error (the sample standard deviation over sqrt(seeds)) and the values."""
    stat = spread(values)
    return {**stat, "se": stat["std"] / math.sqrt(len(values))}


def summarize(runs: list[dict]) -> dict:
    return {
        name: {
            "before": standard_error([run["before"][name] for run in runs]),
            "after": standard_error([run["after"][name] for run in runs]),
            "change": standard_error([run["after"][name] - run["before"][name] for run in runs]),
        }
        for name in MEASURED
    }


def write_report(output_dir: Path, markdown: Path) -> None:
    results = read_results(output_dir)
    settings, summary, runs = results["settings"], results["summary"], results["runs"]

    def cell(stat: dict, signed: bool = False) -> str:
        return f"{stat['mean']:{'+' if signed else ''}.3f} ± {stat['se']:.3f}"

    rows = [
        [label, cell(summary[name]["before"]), cell(summary[name]["after"]), cell(summary[name]["change"], True)]
        + [f"{run['after'][name]:.3f}" for run in runs]
        for name, label in LABELS.items()
    ]
    header = ["held-out", "before", "after", "change"] + [f"after, seed {run['seed']}" for run in runs]
    minutes = [run["runtime_s"] / 60 for run in runs]
    lines = [
        "# The agent demo over seeds",
        "",
        f"`{results['command']}`: `trl-es demo --task tools --seed S` for S = "
        f"{', '.join(str(run['seed']) for run in runs)} ({settings['max_steps']} ES steps, population "
        f"{settings['population_size']}, σ={settings['sigma']}, learning rate {settings['learning_rate']}, "
        f"{settings['prompts_per_step']} training questions per step), measured on the first "
        f"{settings['num_held_out']} held-out questions with greedy episodes. Mean ± standard error over seeds; "
        "the model before ES and the held-out episodes (the prices drawn at each reset) are the same for every seed.",
        "",
        *markdown_table(header, rows),
        "",
        f"Each run took {min(minutes):.1f} to {max(minutes):.1f} minutes on {results['machine']['nproc']} CPU cores "
        f"({results['machine']['processor']}).",
        "",
    ]
    markdown.write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(parser, "tools-demo", 3, "docs/tools_demo", "results.json")
    parser.add_argument("--max_steps", type=int, default=TOOLS_DEMO.max_steps, help="ES steps (default %(default)s).")
    parser.add_argument(
        "--num_held_out", type=int, default=TOOLS_DEMO.num_held_out, help="Held-out questions (default %(default)s)."
    )
    parser.set_defaults(quick=False)  # no quick variant: resolve_work_dir names the work folder by it
    args = parser.parse_args(argv)
    if args.report:
        return rewrite_report(args, write_report)
    work_dir = resolve_work_dir(args)
    jobs = [
        Job(f"seed-{seed}", seed, args.max_steps, args.num_held_out, work_dir / f"seed-{seed}-{args.max_steps}")
        for seed in seed_range(args.seeds)
    ]
    runs = run_jobs(run_job, jobs, 1, "tools-demo")
    settings = asdict(TOOLS_DEMO) | {"max_steps": args.max_steps, "num_held_out": args.num_held_out}
    results = {
        "command": command_line(MODULE, argv),
        "machine": machine_info(),
        "settings": settings,
        "runs": runs,
        "summary": summarize(runs),
    }
    write_results(args.output_dir, results)
    write_report(args.output_dir, markdown_path(args))
    return results


if __name__ == "__main__":
    main()
