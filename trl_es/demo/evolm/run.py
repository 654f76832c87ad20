"""The offline EVOLM demo: the embedded joint model improves on rubrics it writes itself, judged by a frozen judge
that cannot do arithmetic; the null-control model, pretrained without the asymmetry, is run beside it.

`trl-es evolm-demo` (or `make evolm-demo`) runs it on CPU. Training sees questions only (no answer column, no
verifier); the verifier measures the models on held-out problems before and after (`held_out_measurements`).
The models were trained from scratch by the scripts in this folder (`pretrain_joint`, `pretrain_judge`):

- `joint`: answers misread the operation half of the time, rubrics only `JOINT_RUBRIC_MISREAD` of the time (the
  stated asymmetry: judging is easier than answering, the paper's premise);
- `null`: answers and rubrics misread equally often (`NULL_RUBRIC_MISREAD`), the control;
- `judge`: scores (rubric, response) without the question: a pattern matcher.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer

from ...evaluation.coverage import TransformersSampler, coverage_report
from ...tasks.arithmetic import extract_answer, problem
from . import toy
from .settings import (
    ANSWER_MISREAD,
    DEMO_MODELS,
    EVOLM_DEMO,
    JOINT_RUBRIC_MISREAD,
    JUDGE_MODEL,
    NULL_RUBRIC_MISREAD,
    PASS_AT_K,
    EvolmDemoSettings,
)
from .toy import DEMO_PROMPTS


def demo_judge(batch_size: int = 256):
    """The embedded judge, frozen, scoring by log-probability: the expected score from one forward pass."""
    from ...evolm.judges import HFJudge

    return HFJudge(str(JUDGE_MODEL), mode="logprob", prompts=DEMO_PROMPTS, batch_size=batch_size)


def train_evolm(
    model: str | Path,
    settings: EvolmDemoSettings = EVOLM_DEMO,
    output_dir: str | None = None,
    seed: int = 0,
    judge=None,
) -> Path:
    """EVOLM from `model` on the training questions (no answers); returns the folder of the final model."""
    from ...evolm.trainer import EvolmTrainer

    output_dir = output_dir or tempfile.mkdtemp(prefix="trl-es-evolm-demo-")
    trainer = EvolmTrainer(
        model=str(model),
        judge=judge or demo_judge(),
        args=settings.evolm_config(output_dir, seed),
        train_dataset=toy.question_dataset("train", settings.num_train),
    )
    return trainer.train()


def held_out_measurements(model, tokenizer, settings: EvolmDemoSettings = EVOLM_DEMO) -> dict[str, float]:
    """The verifier's measurements on the first `num_held_out` test problems: the policy's greedy accuracy, Pass@k,
    right-reading rate c/(c+m) and slip rate, and what its rubrics state (greedy, and sampled at temperature 1 as
    the policy phases draw them)."""
    problems = [problem("test", index) for index in range(settings.num_held_out)]
    answer_prompts = [DEMO_PROMPTS.policy.format(question=p.question) for p in problems]
    rubric_prompts = [DEMO_PROMPTS.rubric_generation.format(question=p.question) for p in problems]
    coverage = coverage_report(
        model,
        tokenizer,
        answer_prompts,
        [str(p.answer) for p in problems],
        extract_answer,
        ks=PASS_AT_K,
        samples_per_prompt=max(PASS_AT_K),
        max_new_tokens=8,
        seed=settings.eval_seed,
    )
    greedy = sample_completions(model, tokenizer, answer_prompts, 0.0, 8, settings.eval_seed)
    readings = [toy.answer_reading(p, text) for p, text in zip(problems, greedy, strict=True)]
    correct, misread = readings.count("correct"), readings.count("misread")
    measurements = {"greedy_accuracy": coverage.greedy_accuracy}
    measurements |= {f"pass@{k}": value for k, value in coverage.pass_at_k.items()}
    measurements["right_reading"] = correct / max(correct + misread, 1)
    measurements["slip_rate"] = readings.count("slip") / len(readings)
    for label, temperature in (("greedy", 0.0), ("sampled", 1.0)):
        texts = sample_completions(model, tokenizer, rubric_prompts, temperature, settings.max_completion_length, 7)
        kinds = [toy.rubric_reading(p, text) for p, text in zip(problems, texts, strict=True)]
        measurements[f"rubric_correct_{label}"] = kinds.count("correct") / len(kinds)
        measurements[f"rubric_right_reading_{label}"] = kinds.count("correct") / max(
            kinds.count("correct") + kinds.count("misread"), 1
        )
        measurements[f"rubric_generic_{label}"] = kinds.count("generic") / len(kinds)
        if label == "greedy":
            measurements["rubric_invalid_greedy"] = kinds.count("invalid") / len(kinds)
    return measurements


def sample_completions(model, tokenizer, prompts, temperature: float, max_new_tokens: int, seed: int) -> list[str]:
    """One completion of each prompt (text), greedy at temperature 0, with `model.generate` from `seed`."""
    prompt_ids = [tokenizer(prompt)["input_ids"] for prompt in prompts]
    sampled = TransformersSampler(model, tokenizer).sample(prompt_ids, 1, temperature, max_new_tokens, seed)
    return [tokenizer.decode(ids[0], skip_special_tokens=True) for ids in sampled]


@dataclass
class EvolmDemoResult:
    before: dict[str, dict[str, float]]  # model name -> measurements
    after: dict[str, dict[str, float]]
    output_dir: str


def format_table(name: str, before: dict[str, float], after: dict[str, float]) -> str:
    rows = [f"{name:<24}{'before':>8}{'after':>8}{'change':>9}"]
    for key, value in before.items():
        rows.append(f"{key:<24}{value:>8.3f}{after[key]:>8.3f}{after[key] - value:>+9.3f}")
    return "\n".join(rows)


def run_evolm_demo(
    output_dir: str | None = None,
    settings: EvolmDemoSettings = EVOLM_DEMO,
    models: Sequence[str] = ("joint", "null"),
    seed: int = 0,
    log: Callable[[str], None] = print,
) -> EvolmDemoResult:
    """EVOLM on each embedded model in `models`, measured on held-out problems before and after."""
    output_dir = output_dir or tempfile.mkdtemp(prefix="trl-es-evolm-demo-")
    log(
        f"EVOLM demo: policy {settings.policy_method.upper()}, rubrics {settings.rubric_method.upper()}, schedule "
        f"{settings.schedule}, {settings.rounds} rounds "
        f"of {settings.policy_steps} policy + {settings.rubric_steps} rubric steps, pairs {settings.pair_weights}, "
        f"{settings.rubric_reward} rubric reward, {settings.num_train} training questions (no answers)."
    )
    log(
        f"Stated asymmetry: the joint model's rubrics misread {JOINT_RUBRIC_MISREAD:.0%} of the time, its answers "
        f"{ANSWER_MISREAD:.0%}; the null control misreads {NULL_RUBRIC_MISREAD:.0%} in both. The judge reads rubric "
        "and response only."
    )
    result = EvolmDemoResult({}, {}, output_dir)
    for name in models:
        tokenizer = AutoTokenizer.from_pretrained(DEMO_MODELS[name])
        result.before[name] = held_out_measurements(
            AutoModelForCausalLM.from_pretrained(DEMO_MODELS[name]), tokenizer, settings
        )
        final = train_evolm(DEMO_MODELS[name], settings, str(Path(output_dir) / name), seed)
        result.after[name] = held_out_measurements(AutoModelForCausalLM.from_pretrained(final), tokenizer, settings)
        log(f"\n{format_table(f'{name} ({settings.num_held_out} held-out)', result.before[name], result.after[name])}")
    log(
        f"\npass@k: {max(PASS_AT_K)} samples per problem at temperature 1. right_reading = c/(c+m), correct over "
        "correct-or-misread greedy answers; slip_rate: neither. Models: " + output_dir
    )
    return result
