"""The rubric lab's jobs: one (model, method, seed) trained and measured, cached in the work folder
(`experiments.harness.cached_job`)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path

from experiments.harness import cached_job
from experiments.rubric_lab.measuring import measure
from experiments.rubric_lab.settings import RubricLabSettings
from experiments.rubric_lab.training import train_method


@dataclass
class Job:
    model: str
    method: str
    seed: int
    work_dir: str
    settings: RubricLabSettings = field(default_factory=RubricLabSettings)

    @property
    def name(self) -> str:
        """Also its folder under `work_dir`."""
        return f"{self.model}/{self.method}-seed{self.seed}"


@functools.cache
def shared_judge():
    """The demo's judge, loaded once per process for all of its jobs."""
    from trl_es.demo.evolm.run import demo_judge

    return demo_judge()


def run_job(job: Job) -> dict:
    """Train and measure one (model, method, seed), or read its cached result."""
    folder = Path(job.work_dir) / job.name

    def compute() -> dict:
        judge = shared_judge()
        final = train_method(job.settings, job.model, job.method, job.seed, folder, judge)
        reward_model = folder / "reward_model" if job.method == "scalar-rm" else None
        return {"held_out": measure(job.settings, final, judge, reward_model)}

    return cached_job(folder, compute)
