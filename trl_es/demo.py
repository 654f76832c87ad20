"""The offline demo: ES on the embedded arithmetic model, printing held-out Pass@1 and Pass@k before and after.

`trl-es demo` (or `make demo`) runs it on CPU in a few minutes. The model in `trl_es/demo_model` was trained from
scratch by `python -m trl_es.pretrain_arithmetic` on word problems whose worked answers misread the operation half of
the time; ES then trains it on the verifier's reward alone (`trl_es.arithmetic`), and the held-out problems were never
seen in either phase.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer

from .arithmetic import arithmetic_dataset, arithmetic_reward, extract_answer
from .es_config import ESConfig
from .es_trainer import ESTrainer
from .evaluation import CoverageReport, coverage_report

DEMO_MODEL = Path(__file__).parent / "demo_model"
PASS_AT_K = (1, 4, 16)


@dataclass
class DemoResult:
    before: CoverageReport
    after: CoverageReport
    steps: int
    output_dir: str


def held_out_report(model, tokenizer, num_problems: int = 512) -> CoverageReport:
    """Greedy accuracy and Pass@k / Maj@k (16 samples at temperature 1) on the first `num_problems` test problems."""
    test = arithmetic_dataset("test", num_problems)
    return coverage_report(
        model,
        tokenizer,
        list(test["prompt"]),
        list(test["answer"]),
        extract_answer,
        ks=PASS_AT_K,
        samples_per_prompt=max(PASS_AT_K),
        max_new_tokens=4,
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
    max_steps: int = 200,
    population_size: int = 16,
    sigma: float = 0.02,
    learning_rate: float = 0.02,
    seed: int = 0,
    num_held_out: int = 512,
    log=print,
) -> DemoResult:
    """Train the embedded arithmetic model with ES and measure it on held-out problems before and after."""
    output_dir = output_dir or tempfile.mkdtemp(prefix="trl-es-demo-")
    tokenizer = AutoTokenizer.from_pretrained(DEMO_MODEL)
    before = held_out_report(AutoModelForCausalLM.from_pretrained(DEMO_MODEL), tokenizer, num_held_out)
    log(f"Before ES, on {num_held_out} held-out problems: greedy accuracy {before.greedy_accuracy:.3f}")

    args = ESConfig(
        output_dir=output_dir,
        population_size=population_size,
        sigma=sigma,
        learning_rate=learning_rate,
        per_device_train_batch_size=64,  # prompts per step, answered greedily by every member
        max_completion_length=4,
        max_steps=max_steps,
        logging_steps=20,
        save_strategy="no",
        report_to=[],
        seed=seed,
        use_cpu=True,
    )
    trainer = ESTrainer(
        model=str(DEMO_MODEL),
        reward_funcs=arithmetic_reward,
        args=args,
        train_dataset=arithmetic_dataset("train", 4096),
    )
    trainer.train()
    trainer.save_model()

    after = held_out_report(trainer.model, tokenizer, num_held_out)
    log(format_reports(before, after))
    log(f"pass@k and maj@k: {before.samples_per_prompt} samples per problem at temperature 1. Model: {output_dir}")
    return DemoResult(before, after, max_steps, output_dir)
