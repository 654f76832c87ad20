"""Training for the coverage lab: each method from the demo model through `SequentialTrainer` (one or two stages),
the GRPO learning-rate sweep, and the training-reward curve of a run."""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import replace
from pathlib import Path

from transformers import TrainerCallback

from experiments.coverage_lab.settings import CALIBRATION_STEPS, LabSettings
from trl_es.demo.run import DEMO, DEMO_MODEL
from trl_es.tasks.arithmetic import arithmetic_dataset, arithmetic_reward


class LogHistoryRecorder(TrainerCallback):
    """Writes the trainer's `log_history` to `<output_dir>/log_history.json` when training ends (the lab saves no
    Trainer checkpoints, so there is no trainer_state.json to read it from)."""

    def on_train_end(self, args, state, control, **kwargs):
        Path(args.output_dir).mkdir(parents=True, exist_ok=True)
        (Path(args.output_dir) / "log_history.json").write_text(json.dumps(state.log_history))


class TrainingClock(TrainerCallback):
    """Measures a stage's training seconds, step by step: process CPU seconds (what the lab equalises: with one torch
    thread per worker it is the compute a step used, however busy the machine's other cores were) and wall seconds.
    Writes `<output_dir>/training_seconds.json` when training ends."""

    def __init__(self):
        self.steps: list[dict[str, float]] = []

    def on_step_begin(self, args, state, control, **kwargs):
        self._started = (time.process_time(), time.perf_counter())

    def on_step_end(self, args, state, control, **kwargs):
        cpu, wall = self._started
        self.steps.append({"cpu": time.process_time() - cpu, "wall": time.perf_counter() - wall})

    def on_train_end(self, args, state, control, **kwargs):
        totals = {kind: sum(step[kind] for step in self.steps) for kind in ("cpu", "wall")}
        Path(args.output_dir).mkdir(parents=True, exist_ok=True)
        (Path(args.output_dir) / "training_seconds.json").write_text(json.dumps({**totals, "steps": self.steps}))
        self.steps = []


class StopAfter(TrainerCallback):
    """Stops training after `steps` optimizer steps, leaving the learning-rate schedule of the full run."""

    def __init__(self, steps: int):
        self.steps = steps

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.steps:
            control.should_training_stop = True


def es_config(settings: LabSettings, output_dir: str, steps: int, seed: int):
    """The demo's ESConfig (`trl_es.demo.run.DemoSettings.es_config`: greedy, on CPU, no checkpoints) with the lab's
    N, σ, α, prompts per step, completion length and logging, for `steps` steps, and its `es_overrides`."""
    demo = replace(
        DEMO,
        max_steps=steps,
        population_size=settings.population_size,
        sigma=settings.sigma,
        learning_rate=settings.es_learning_rate,
        prompts_per_step=settings.prompts_per_step * settings.es_generations,  # completions per member and step
        max_completion_length=settings.max_completion_length,
        logging_steps=settings.logging_steps,
    )
    return demo.es_config(output_dir, seed, disable_tqdm=True, **settings.es_overrides)


def grpo_config(settings: LabSettings, output_dir: str, steps: int, seed: int, learning_rate: float):
    """GRPOConfig with `prompts_per_step x num_generations` completions per step at temperature 1 (AdamW, beta=0,
    TRL's default loss and linear schedule), float32 on CPU."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=output_dir,
        per_device_train_batch_size=settings.completions_per_grpo_step,
        num_generations=settings.num_generations,
        max_completion_length=settings.max_completion_length,
        temperature=1.0,
        learning_rate=learning_rate,
        max_steps=steps,
        logging_steps=settings.logging_steps,
        save_strategy="no",
        report_to=[],
        seed=seed,
        bf16=False,
        use_cpu=True,
        disable_tqdm=True,
    )


def train_stages(settings: LabSettings, method: str, seed: int, output_dir: Path, grpo_lr: float) -> Path:
    """Train `method` ("es", "grpo", "es-then-grpo", "grpo-then-es") from the demo model with SequentialTrainer;
    returns the final model's folder. Sequential methods spend half the budget in each stage."""
    from trl_es.sequential.trainer import SequentialTrainer

    half = method in ("es-then-grpo", "grpo-then-es")
    es_steps = settings.es_steps // 2 if half else settings.es_steps
    grpo_steps = settings.grpo_steps // 2 if half else settings.grpo_steps
    es_stage = es_config(settings, str(output_dir), es_steps, seed)
    grpo_stage = grpo_config(settings, str(output_dir), grpo_steps, seed, grpo_lr)
    stages = {
        "es": [es_stage],
        "grpo": [grpo_stage],
        "es-then-grpo": [es_stage, grpo_stage],
        "grpo-then-es": [grpo_stage, es_stage],
    }[method]
    trainer = SequentialTrainer(
        model=str(DEMO_MODEL),
        stages=stages,
        output_dir=str(output_dir),
        reward_funcs=arithmetic_reward,
        train_dataset=arithmetic_dataset("train", settings.num_train),
        callbacks=[LogHistoryRecorder(), TrainingClock()],
    )
    return trainer.train()


def training_seconds(run_dir: Path) -> dict[str, float]:
    """The CPU and wall seconds of a run's training steps, over its stages (`TrainingClock`)."""
    stages = [json.loads(path.read_text()) for path in run_dir.glob("stage-*/training_seconds.json")]
    return {kind: sum(stage[kind] for stage in stages) for kind in ("cpu", "wall")}


def calibrate_seconds_per_step(settings: LabSettings, grpo_lr: float, seed: int, work_dir: Path) -> dict[str, float]:
    """CPU seconds per training step of ES and of GRPO from the demo model, the mean of `CALIBRATION_STEPS` - 1 steps
    after a first one that warms up."""
    from trl import GRPOTrainer

    from trl_es import ESTrainer
    from trl_es.compat.accelerate import reset_accelerator_state

    measured = {}
    for method in ("es", "grpo"):
        output_dir = str(work_dir / f"calibrate-{method}")
        if method == "es":
            trainer_class, args = ESTrainer, es_config(settings, output_dir, CALIBRATION_STEPS, seed)
        else:
            trainer_class, args = GRPOTrainer, grpo_config(settings, output_dir, CALIBRATION_STEPS, seed, grpo_lr)
        clock = TrainingClock()
        trainer = trainer_class(
            model=str(DEMO_MODEL),
            reward_funcs=arithmetic_reward,
            args=args,
            train_dataset=arithmetic_dataset("train", settings.num_train),
            callbacks=[clock],
        )
        trainer.train()
        reset_accelerator_state()
        steps = json.loads((Path(output_dir) / "training_seconds.json").read_text())["steps"]
        measured[method] = statistics.fmean(step["cpu"] for step in steps[1:])
    return measured


def reward_curve(settings: LabSettings, run_dir: Path) -> dict[str, list[float]]:
    """Training reward against completions spent, over the stages of a run: ES logs the mean member reward, GRPO the
    mean reward of its sampled completions (both as `reward`, averaged over each logging window)."""
    completions, rewards, spent = [], [], 0
    for stage_dir in sorted(run_dir.glob("stage-*"), key=lambda path: int(path.name.split("-")[1])):
        per_step = (
            settings.completions_per_es_step if stage_dir.name.endswith("-es") else settings.completions_per_grpo_step
        )
        history = json.loads((stage_dir / "log_history.json").read_text())
        points = [(entry["step"], entry["reward"]) for entry in history if "reward" in entry]
        completions += [spent + step * per_step for step, _ in points]
        rewards += [reward for _, reward in points]
        spent += max((entry.get("step", 0) for entry in history), default=0) * per_step
    return {"completions": completions, "reward": rewards}


def sweep_grpo_learning_rate(settings: LabSettings, learning_rate: float, seed: int, work_dir: Path) -> dict:
    """`sweep_steps` GRPO steps at `learning_rate` (with the full run's schedule): the mean training reward of the
    last 10 logged steps, and the curve. Held-out problems play no part."""
    from trl import GRPOTrainer

    from trl_es.compat.accelerate import reset_accelerator_state

    output_dir = work_dir / f"sweep-lr{learning_rate:g}"
    args = grpo_config(settings, str(output_dir), settings.grpo_steps, seed, learning_rate)
    args.logging_steps = 1
    trainer = GRPOTrainer(
        model=str(DEMO_MODEL),
        reward_funcs=arithmetic_reward,
        args=args,
        train_dataset=arithmetic_dataset("train", settings.num_train),
        callbacks=[StopAfter(settings.sweep_steps)],
    )
    trainer.train()
    reset_accelerator_state()  # the next trainer in this process builds its own Accelerator
    rewards = [entry["reward"] for entry in trainer.state.log_history if "reward" in entry]
    return {"learning_rate": learning_rate, "rewards": rewards, "final_reward": statistics.fmean(rewards[-10:])}
