"""The offline demo: ES on the embedded arithmetic model, printing held-out Pass@1 and Pass@k before and after.

`trl-es demo` (or `make demo`) runs it on CPU in a few minutes. The model in `trl_es/demo/model` was trained from
scratch by `python -m trl_es.demo.pretrain` on word problems whose worked answers misread the operation half of
the time; ES then trains it on the verifier's reward alone (`trl_es.tasks.arithmetic`), and the held-out problems
were never seen in either phase.

`DemoSettings` holds the demo's settings and `held_out_report` its evaluation; the coverage lab
(`experiments/coverage_lab/`) starts from both.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from transformers import AutoModelForCausalLM, AutoTokenizer

from ..evaluation.coverage import CoverageReport, coverage_report
from ..tasks.arithmetic import arithmetic_dataset, arithmetic_reward, extract_answer

if TYPE_CHECKING:
    from ..trainer.es_config import ESConfig

DEMO_MODEL = Path(__file__).parent / "model"
PASS_AT_K = (1, 4, 16)


@dataclass(frozen=True)
class DemoSettings:
    """The demo's ES run and held-out evaluation. `trl-es demo` runs `DEMO`, the defaults; `run_demo`'s arguments
    replace some of them."""

    # ES: every member answers the same `prompts_per_step` training prompts greedily, once each
    # (`population_size x prompts_per_step` completions per step); its fitness is the mean reward.
    max_steps: int = 200
    population_size: int = 16
    sigma: float = 0.02
    learning_rate: float = 0.02
    prompts_per_step: int = 64
    max_completion_length: int = 4
    logging_steps: int = 20
    num_train: int = 4096  # training problems
    # Held-out evaluation (`held_out_report`): the first `num_held_out` test problems, never trained on.
    num_held_out: int = 512
    eval_seed: int = 1234  # sampling seed of the Pass@k / Maj@k samples

    def es_config(self, output_dir: str, seed: int = 0, **overrides) -> ESConfig:
        """The ESConfig of these settings: greedy decoding, on CPU, no checkpoints, no reporting; `overrides` are
        further ESConfig fields (e.g. `disable_tqdm=True`)."""
        fields = {
            "population_size": self.population_size,
            "sigma": self.sigma,
            "learning_rate": self.learning_rate,
            "per_device_train_batch_size": self.prompts_per_step,  # prompts per step, answered by every member
            "max_completion_length": self.max_completion_length,
            "max_steps": self.max_steps,
            "logging_steps": self.logging_steps,
        }
        return demo_es_config(output_dir, seed, **(fields | overrides))


def demo_es_config(output_dir: str, seed: int, **fields) -> ESConfig:
    """An ESConfig as the demos run it: greedy decoding (one completion per prompt and member), on CPU, no
    checkpoints, no reporting, with `fields` on top."""
    from ..trainer.es_config import ESConfig

    defaults = {"temperature": 0.0, "save_strategy": "no", "report_to": [], "use_cpu": True}
    return ESConfig(output_dir=output_dir, seed=seed, **(defaults | fields))


DEMO = DemoSettings()


@dataclass
class DemoResult:
    before: CoverageReport
    after: CoverageReport
    steps: int
    output_dir: str


def held_out_report(
    model,
    tokenizer,
    num_problems: int = DEMO.num_held_out,
    *,
    ks: Sequence[int] = PASS_AT_K,
    samples_per_prompt: int | None = None,
    max_new_tokens: int = DEMO.max_completion_length,
    seed: int = DEMO.eval_seed,
) -> CoverageReport:
    """Greedy accuracy and Pass@k / Maj@k for `ks` (from `samples_per_prompt` samples at temperature 1, default
    `max(ks)`) on the first `num_problems` test problems, answers of at most `max_new_tokens` tokens sampled with
    `seed`."""
    test = arithmetic_dataset("test", num_problems)
    return coverage_report(
        model,
        tokenizer,
        list(test["prompt"]),
        list(test["answer"]),
        extract_answer,
        ks=ks,
        samples_per_prompt=max(ks) if samples_per_prompt is None else samples_per_prompt,
        max_new_tokens=max_new_tokens,
        seed=seed,
    )


def format_reports(before: CoverageReport, after: CoverageReport) -> str:
    """A before/after table of every measurement."""
    rows = [f"{'held-out':<16}{'before':>8}{'after':>8}{'change':>9}"]
    after_values = after.as_dict()
    for name, value in before.as_dict().items():
        rows.append(f"{name:<16}{value:>8.3f}{after_values[name]:>8.3f}{after_values[name] - value:>+9.3f}")
    return "\n".join(rows)


def run_demo(
    output_dir: str | None = None,
    max_steps: int = DEMO.max_steps,
    population_size: int = DEMO.population_size,
    sigma: float = DEMO.sigma,
    learning_rate: float = DEMO.learning_rate,
    seed: int = 0,
    num_held_out: int = DEMO.num_held_out,
    log=print,
) -> DemoResult:
    """Train the embedded arithmetic model with ES and measure it on held-out problems before and after."""
    from ..trainer.es_trainer import ESTrainer

    settings = replace(
        DEMO,
        max_steps=max_steps,
        population_size=population_size,
        sigma=sigma,
        learning_rate=learning_rate,
        num_held_out=num_held_out,
    )
    output_dir = output_dir or tempfile.mkdtemp(prefix="trl-es-demo-")
    tokenizer = AutoTokenizer.from_pretrained(DEMO_MODEL)
    before = held_out_report(AutoModelForCausalLM.from_pretrained(DEMO_MODEL), tokenizer, settings.num_held_out)
    log(f"Before ES, on {settings.num_held_out} held-out problems: greedy accuracy {before.greedy_accuracy:.3f}")

    trainer = ESTrainer(
        model=str(DEMO_MODEL),
        reward_funcs=arithmetic_reward,
        args=settings.es_config(output_dir, seed),
        train_dataset=arithmetic_dataset("train", settings.num_train),
    )
    trainer.train()
    trainer.save_model()

    after = held_out_report(trainer.model, tokenizer, settings.num_held_out)
    log(format_reports(before, after))
    log(f"pass@k and maj@k: {before.samples_per_prompt} samples per problem at temperature 1. Model: {output_dir}")
    return DemoResult(before, after, settings.max_steps, output_dir)
