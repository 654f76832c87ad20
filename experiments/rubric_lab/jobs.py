"""The rubric lab's jobs: one (model, method, pretraining seed, training seed) trained and measured, cached in the
work folder (`experiments.harness.cached_job`)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path

from experiments.harness import cached_job
from experiments.rubric_lab.arms import arm_folders
from experiments.rubric_lab.measuring import measure, phase_history
from experiments.rubric_lab.settings import RubricLabSettings
from experiments.rubric_lab.training import train_method


@dataclass
class Job:
    model: str  # "joint" or "null"
    method: str
    pretraining_seed: int  # which pair of arms
    seed: int  # the training seed
    work_dir: str
    settings: RubricLabSettings = field(default_factory=RubricLabSettings)

    @property
    def name(self) -> str:
        """Also its folder under `work_dir`; the base model is not trained, so it is one job per pretraining seed."""
        run = "base" if self.method == "base" else f"{self.method}-seed{self.seed}"
        return f"{self.model}/pretrain{self.pretraining_seed}/{run}"


@functools.cache
def shared_judge():
    """The demo's judge, loaded once per process for all of its jobs."""
    from trl_es.demo.evolm.run import demo_judge

    return demo_judge()


def run_job(job: Job) -> dict:
    """Train and measure one job, or read its cached result: the held-out measurements, each held-out problem's
    greedy correctness (for the paired bootstrap) and, for EVOLM methods, every phase's diagnostics."""
    folder = Path(job.work_dir) / job.name

    def compute() -> dict:
        judge = shared_judge()
        start = arm_folders(job.pretraining_seed, job.work_dir)[job.model]
        final = train_method(job.settings, start, job.method, job.seed, folder, judge)
        reward_model = folder / "reward_model" if job.method == "scalar-rm" else None
        held_out, greedy_correct = measure(job.settings, final, judge, reward_model)
        return {"held_out": held_out, "greedy_correct": greedy_correct, "phases": phase_history(folder / "run")}

    return cached_job(folder, compute, threads=1)
