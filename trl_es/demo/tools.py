"""The offline agent demo: ES on the embedded tool-calling model, through the environment's reward alone.

`trl-es demo --task tools` runs it on CPU in a few minutes. The model in `trl_es/demo/tools_model` was trained from
scratch by `python -m trl_es.demo.pretrain_tools` on a careless solver's transcripts of the price questions of
`trl_es.tasks.lookup`: it calls `lookup` and `answer` in the compact tool-calling chat template, but on some kinds of
question it answers a guess instead of looking the price up. ESTrainer then trains it with
`environment_factory=LookupEnvironment`, every population member playing whole episodes (its calls, the tool results,
its answer) with its own weights, scored by the reward the environment owns (`get_reward`, as GRPOTrainer reads it).
The held-out questions were seen neither in pretraining nor in ES training.

The held-out measurement is `ESTrainer.evaluate` on the test questions, with the centre's greedy episodes: success
(the environment's reward, `rewards/LookupEnvironment`), tool calls per episode (`tools/call_frequency`), failed
calls per call (`tools/failure_frequency`) and assistant turns per episode (`turns`, a reward function of weight 0:
logged, never trained on).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from ..tasks.lookup import LookupEnvironment, lookup_dataset
from .run import demo_es_config

if TYPE_CHECKING:
    from ..trainer.es_config import ESConfig
    from ..trainer.es_trainer import ESTrainer

TOOLS_MODEL = Path(__file__).parent / "tools_model"
# ESConfig.seed of every demo run: the prices drawn when the held-out episodes are reset (the same before and after
# training, and for every training seed).
EPISODE_SEED = 0


def turns(completions, **kwargs) -> list[float]:
    """Assistant turns in the episode (its tool-calling turns and its closing one); weight 0 in the demo, a
    measurement only."""
    return [float(sum(message["role"] == "assistant" for message in completion)) for completion in completions]


@dataclass(frozen=True)
class ToolsDemoSettings:
    """The agent demo's ES run and held-out evaluation. `trl-es demo --task tools` runs `TOOLS_DEMO`."""

    # ES: every member plays the same `prompts_per_step` training episodes greedily, once each; its fitness is
    # its mean success.
    max_steps: int = 60
    population_size: int = 16
    sigma: float = 0.02
    learning_rate: float = 0.02
    prompts_per_step: int = 32
    max_completion_length: int = 48  # the whole episode: calls, tool results and answer
    max_tool_calling_iterations: int = 3
    logging_steps: int = 10
    num_train: int = 2048  # training questions
    num_held_out: int = 256  # the first test questions, never trained on

    def es_config(self, output_dir: str, seed: int = 0, **overrides) -> ESConfig:
        """The ESConfig of these settings (`demo_es_config`: greedy, on CPU, no checkpoints); `overrides` are further
        ESConfig fields. `seed` sets the members' noise (`noise_seed`) and the order of the training questions
        (`data_seed`); ESConfig's own `seed`, which seeds the evaluation's environments, stays `EPISODE_SEED`, so
        every run is measured on the same held-out episodes."""
        fields = {
            "population_size": self.population_size,
            "sigma": self.sigma,
            "learning_rate": self.learning_rate,
            "per_device_train_batch_size": self.prompts_per_step,  # questions per step, played by every member
            "per_device_eval_batch_size": 64,
            "max_completion_length": self.max_completion_length,
            "max_tool_calling_iterations": self.max_tool_calling_iterations,
            "reward_weights": [0.0],  # `turns` is measured; the environment's own reward (weight 1) trains
            "max_steps": self.max_steps,
            "logging_steps": self.logging_steps,
        }
        fields |= {"noise_seed": seed, "data_seed": seed}
        return demo_es_config(output_dir, EPISODE_SEED, **(fields | overrides))


TOOLS_DEMO = ToolsDemoSettings()

# Held-out measurement: the logged eval key of each row of the demo's table.
MEASURED = {
    "success": "eval_rewards/LookupEnvironment/mean",
    "tool calls": "eval_tools/call_frequency",
    "failed calls": "eval_tools/failure_frequency",
    "turns": "eval_rewards/turns/mean",
}
LABELS = {
    "success": "success",
    "tool calls": "tool calls per episode",
    "failed calls": "failed calls per call",
    "turns": "turns per episode",
}


@dataclass
class ToolsDemoResult:
    before: dict[str, float]
    after: dict[str, float]
    output_dir: str


def tools_trainer(settings: ToolsDemoSettings, output_dir: str, seed: int = 0, model=TOOLS_MODEL) -> ESTrainer:
    """The demo's ESTrainer: the embedded model (or `model`) and the lookup environment, which owns the reward (as in
    GRPO, its `get_reward` is a reward of weight 1), `turns` measured, the training questions, and the held-out ones
    as its eval dataset."""
    from ..trainer.es_trainer import ESTrainer

    return ESTrainer(
        model=str(model),
        reward_funcs=turns,
        args=settings.es_config(output_dir, seed),
        train_dataset=lookup_dataset("train", settings.num_train),
        eval_dataset=lookup_dataset("test", settings.num_held_out),
        environment_factory=LookupEnvironment,
    )


def held_out_episodes(trainer: ESTrainer) -> dict[str, float]:
    """The centre's greedy episodes on the trainer's held-out questions: success, tool calls and turns per episode,
    failed calls per call (`MEASURED`)."""
    trainer.evaluate()
    logged = trainer.state.log_history[-1]
    return {name: logged[key] for name, key in MEASURED.items()}


def format_episodes(before: dict[str, float], after: dict[str, float], num_held_out: int) -> str:
    rows = [f"{f'{num_held_out} held-out episodes':<26}{'before':>8}{'after':>8}{'change':>9}"]
    for name, label in LABELS.items():
        rows.append(f"{label:<26}{before[name]:>8.3f}{after[name]:>8.3f}{after[name] - before[name]:>+9.3f}")
    return "\n".join(rows)


def run_tools_demo(
    output_dir: str | None = None,
    max_steps: int = TOOLS_DEMO.max_steps,
    seed: int = 0,
    num_held_out: int = TOOLS_DEMO.num_held_out,
    settings: ToolsDemoSettings = TOOLS_DEMO,
    log=print,
) -> ToolsDemoResult:
    """Train the embedded tool-calling model with ES on the lookup environment and measure its held-out episodes
    before and after."""
    settings = replace(settings, max_steps=max_steps, num_held_out=num_held_out)
    output_dir = output_dir or tempfile.mkdtemp(prefix="trl-es-tools-demo-")
    trainer = tools_trainer(settings, output_dir, seed)
    before = held_out_episodes(trainer)
    log(f"Before ES, on {settings.num_held_out} held-out episodes: success {before['success']:.3f}")
    trainer.train()
    trainer.save_model()
    after = held_out_episodes(trainer)
    log(format_episodes(before, after, settings.num_held_out))
    log(f"Greedy episodes, at most {settings.max_tool_calling_iterations} rounds of tool calls. Model: {output_dir}")
    return ToolsDemoResult(before, after, output_dir)
