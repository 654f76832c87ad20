"""The coverage lab's jobs: the base model's measurement, one GRPO learning-rate sweep run, or one trained method for
one seed, each run in a worker process (`experiments.harness.run_jobs`) and cached in the work folder."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from experiments.coverage_lab.measuring import held_out_metrics, population_js_diversity, sparsified_metrics
from experiments.coverage_lab.settings import LabSettings
from experiments.coverage_lab.training import (
    calibrate_seconds_per_step,
    reward_curve,
    sweep_grpo_learning_rate,
    train_stages,
    training_seconds,
)
from experiments.harness import cached_job
from trl_es.demo.run import DEMO_MODEL


@dataclass
class Job:
    """One unit of work, run in a worker process: `kind` is "base", "sweep", "calibrate" or a trained method."""

    kind: str
    seed: int = 0
    learning_rate: float = 0.0  # the sweep's, or GRPO's for a method with a GRPO stage
    work_dir: str = ""
    settings: LabSettings = field(default_factory=LabSettings)
    threads: int = 1

    @property
    def name(self) -> str:
        if self.kind == "base":
            return "base"
        if self.kind == "sweep":
            return f"sweep-lr{self.learning_rate:g}"
        if self.kind == "calibrate":
            return "calibrate"
        return f"{self.kind}-seed{self.seed}"


def run_job(job: Job) -> dict:
    """Run one job (or read its cached result): train, then measure."""
    folder = Path(job.work_dir) / job.name
    settings = job.settings

    def compute() -> dict:
        if job.kind == "sweep":
            return sweep_grpo_learning_rate(settings, job.learning_rate, settings.seeds[0], folder)
        if job.kind == "calibrate":
            return {"seconds_per_step": calibrate_seconds_per_step(settings, job.learning_rate, job.seed, folder)}
        if job.kind == "base":
            return {"held_out": held_out_metrics(settings, DEMO_MODEL), "shift": 0.0}
        return train_and_measure(job, folder)

    return cached_job(folder, compute, job.threads)


def train_and_measure(job: Job, folder: Path) -> dict:
    """Train one method for one seed and measure it: held-out metrics, shift, reward curve; for ES also the
    population's JS diversity before and after and the sparsified checkpoints; for GRPO→ES the JS diversity around
    the GRPO checkpoint (start of its ES stage) and at the end."""
    from trl_es.evaluation.analysis import parameter_shift

    settings = job.settings
    final = train_stages(settings, job.kind, job.seed, folder / "run", job.learning_rate)
    result = {
        "held_out": held_out_metrics(settings, final),
        "shift": parameter_shift(DEMO_MODEL, final).relative_l2,
        "curve": reward_curve(settings, folder / "run"),
        "training_seconds": training_seconds(folder / "run"),
    }
    if job.kind in ("es", "grpo-then-es"):
        start = DEMO_MODEL if job.kind == "es" else folder / "run" / "stage-0-grpo" / "final"
        result["js_diversity"] = {
            "start": population_js_diversity(settings, start, job.seed),
            "end": population_js_diversity(settings, final, job.seed),
        }
    if job.kind == "es":
        result["sparsity"] = sparsified_metrics(settings, final, folder / "sparse")
    return result
