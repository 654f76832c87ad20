"""What both labs share: the command line's common flags, jobs cached on disk and run in worker processes, mean ± std
over seeds, the machine and its load, the results file, and the pieces of their reports (tables, plot axes, links).

A lab is a package of `experiments/` run as `python -m experiments.<lab>`: it trains and measures its jobs
(`run_jobs`), writes everything to `<output_dir>/results.json` (`write_results`) and renders its Markdown report and
plots from that file alone, so that `--report` redraws them without training.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
RESULTS_FILE = "results.json"


# --------------------------------------------------------------------------------------------------------------------
# Command line


def add_common_arguments(parser: argparse.ArgumentParser, name: str, seeds: int, output_dir: str, outputs: str):
    """The flags every lab (`name`) has: --seeds, --output_dir (default `output_dir` in the repository), --markdown,
    --work_dir and --report. `outputs` says what the output folder receives."""
    parser.set_defaults(lab=name)  # names the default work folder (`resolve_work_dir`)
    parser.add_argument("--seeds", type=int, default=seeds, help="Number of seeds (0, 1, ...; default %(default)s).")
    parser.add_argument(
        "--output_dir",
        type=Path,
        default=REPOSITORY / output_dir,
        help=f"Where {outputs} go (default: {output_dir} in the repository).",
    )
    parser.add_argument("--markdown", type=Path, default=None, help="The report (default: <output_dir>.md).")
    parser.add_argument(
        "--work_dir",
        type=Path,
        default=None,
        help=f"Checkpoints and cached per-job results (default: <tmp>/trl-es-{name}[-quick]); reused when rerun.",
    )
    parser.add_argument(
        "--report",
        "--report_only",
        dest="report",
        action="store_true",
        help="Only redraw the report and its plots from <output_dir>/results.json, without training (--report_only: "
        "its old name).",
    )


def add_worker_arguments(parser: argparse.ArgumentParser, workers: int) -> None:
    """--workers (default `workers`, 1 with --quick) and --threads: how a lab's jobs share the machine."""
    parser.add_argument(
        "--workers", type=int, default=None, help=f"Worker processes (default {workers}; 1 with --quick)."
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker (default %(default)s).")


def worker_count(args: argparse.Namespace, workers: int) -> int:
    return args.workers or (1 if args.quick else workers)


def markdown_path(args: argparse.Namespace) -> Path:
    return args.markdown or args.output_dir.with_suffix(".md")


def rewrite_report(args: argparse.Namespace, write_report: Callable[[Path, Path], None]) -> dict:
    """--report: the lab's `write_report(output_dir, markdown)`, from the results file alone; returns the results."""
    write_report(args.output_dir, markdown_path(args))
    return read_results(args.output_dir)


def resolve_work_dir(args: argparse.Namespace) -> Path:
    """--work_dir, or `<tmp>/trl-es-<lab>[-quick]`: a quick run never reuses a full run's cached jobs."""
    return args.work_dir or Path(tempfile.gettempdir()) / f"trl-es-{args.lab}{'-quick' if args.quick else ''}"


def seed_range(count: int) -> tuple[int, ...]:
    return tuple(range(count))


def command_line(module: str, argv: Sequence[str] | None) -> str:
    """The command that reproduces this run, as the report shows it."""
    arguments = argv if argv is not None else sys.argv[1:]
    return f"python -m {module} {' '.join(shlex.quote(argument) for argument in arguments)}".strip()


# --------------------------------------------------------------------------------------------------------------------
# Jobs: one unit of training and measuring each, cached as JSON so that an interrupted lab resumes


def cached_job(folder: Path, compute: Callable[[], dict], threads: int | None = None) -> dict:
    """`folder/result.json` if an earlier run wrote it; else `compute()` (on `threads` torch threads), with its
    `runtime_s`, written there. Either way the result has JSON's key types (strings), fresh or cached."""
    cached = folder / "result.json"
    if cached.is_file():
        return json.loads(cached.read_text())
    from trl_es.demo.pretrain import torch_threads  # torch only where a job runs: `--report` does without it

    started = time.time()
    folder.mkdir(parents=True, exist_ok=True)
    with torch_threads(threads):
        result = compute()
    result["runtime_s"] = time.time() - started
    result = json.loads(json.dumps(result))
    cached.write_text(json.dumps(result))
    gc.collect()
    return result


def run_jobs(run_job: Callable, jobs: list, workers: int, tag: str, log=print) -> list[dict]:
    """`run_job(job)` for every job (each has a `name`), in `workers` spawned processes (in this process when
    `workers` is 1); the results in the order of `jobs`. `run_job` must be a module-level function (it is pickled)."""
    results = []
    if workers <= 1:
        for job in jobs:
            log(f"[{tag}] {job.name} ...")
            results.append(run_job(job))
            log(f"[{tag}] {job.name} done in {results[-1]['runtime_s']:.0f} s")
        return results
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(run_job, job) for job in jobs]
        for job, future in zip(jobs, futures, strict=True):
            results.append(future.result())
            log(f"[{tag}] {job.name} done in {results[-1]['runtime_s']:.0f} s")
    return results


# --------------------------------------------------------------------------------------------------------------------
# Summaries over seeds


def spread(values: list[float]) -> dict:
    """Mean, sample standard deviation (0 for one value) and the values themselves."""
    return {
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "values": values,
    }


def cell(stat: dict, digits: int = 3) -> str:
    """A spread as a table cell: `mean ± std`."""
    return f"{stat['mean']:.{digits}f} ± {stat['std']:.{digits}f}"


# --------------------------------------------------------------------------------------------------------------------
# The machine


def machine_info() -> dict:
    """What the numbers were measured on."""
    import torch
    import transformers
    import trl

    return {
        "nproc": os.cpu_count(),
        "affinity_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl.__version__,
        "load_average_at_start": load_average(),
    }


def load_average() -> tuple[float, float, float] | None:
    """The 1-, 5- and 15-minute load averages, or None where the platform does not give them (`os.getloadavg` is
    missing, or raises OSError)."""
    try:
        return os.getloadavg()
    except (AttributeError, OSError):
        return None


# --------------------------------------------------------------------------------------------------------------------
# The results file


def write_results(output_dir: Path, results: dict) -> Path:
    output_dir.mkdir(parents=True, exist_ok=True)
    path = output_dir / RESULTS_FILE
    path.write_text(json.dumps(results, indent=1, default=str))
    return path


def read_results(output_dir: Path) -> dict:
    path = output_dir / RESULTS_FILE
    if not path.is_file():
        raise SystemExit(f"{path} does not exist: run the lab first (without --report) to write it.")
    return json.loads(path.read_text())


# --------------------------------------------------------------------------------------------------------------------
# Reports: Markdown tables, links, plot axes


def compared(values, baseline=None, draws: int = 2000, seed: int = 0) -> dict:
    """A lab's cell of `(runs, problems)` values: their two-level bootstrap `interval` and, against `baseline` (the
    same runs' and problems' values of another method), the paired `difference` with the sign-flip `p` over problems
    of the per-problem difference averaged over runs (`trl_es.evaluation.intervals`)."""
    from trl_es.evaluation.intervals import bootstrap_interval, paired_comparison

    found = {"interval": bootstrap_interval(values, draws, seed).as_dict()}
    if baseline is not None:
        difference, p = paired_comparison(values, baseline, draws, seed)
        found["difference"] = {**difference.as_dict(), "p": p}
    return found


def interval_cell(stat: dict, signed: bool = False) -> str:
    """An interval as a table cell: `0.467 [0.431, 0.503]`, signed (`+0.078 [+0.040, +0.110]`) for a difference."""
    sign = "+" if signed else ""
    low, high = stat["ci"]
    return f"{stat['mean']:{sign}.3f} [{low:{sign}.3f}, {high:{sign}.3f}]"


def p_value(p: float) -> str:
    """`p=0.012`, or `p<0.001` below what three decimals show."""
    return "p<0.001" if p < 0.001 else f"p={p:.3f}"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]], rule: str = "---") -> list[str]:
    """The lines of a Markdown table; `rule` is each column's cell in the line under the header."""
    return [
        "| " + " | ".join(header) + " |",
        "|" + f"{rule}|" * len(header),
        *("| " + " | ".join(cells) + " |" for cells in rows),
    ]


def relative_link(path: Path, markdown: Path) -> str:
    """`path` as the report at `markdown` links to it."""
    return os.path.relpath(path, markdown.parent)


def finish_axes(axes, title: str, xlabel: str | None = None, ylabel: str | None = None, grid: str = "both") -> None:
    """Every lab plot's last touches: labels, the title, a light grid and the legend."""
    if xlabel:
        axes.set_xlabel(xlabel)
    if ylabel:
        axes.set_ylabel(ylabel)
    axes.set_title(title)
    axes.grid(alpha=0.3, axis=grid)
    axes.legend()
