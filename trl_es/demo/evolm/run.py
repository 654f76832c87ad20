"""The offline EVOLM demo: two models improve, or do not, on rubrics they write themselves, judged by a frozen judge
that cannot do arithmetic.

`trl-es evolm-demo` (or `make evolm-demo`) runs it on CPU. Training sees questions only (no answer column, no
verifier); the verifier measures the models before any training (`gates`, on the training questions) and on held-out
problems before and after (`held_out_measurements`). The models were trained from scratch by the scripts in this
folder (`pretrain_arms`, `pretrain_judge`), both arms from one shared checkpoint:

- answers misread the operation systematically: on three of the six question templates nine times in ten, elsewhere
  one in ten (a habit per question, which a policy phase can unlearn);
- `joint`: rubrics misread at random, one in four, whatever the template: on the hard templates its rubrics know
  better than its answers (the paper's premise that judging is easier than answering);
- `null`: rubrics misread by the answers' rule, drawn independently: no question on which they know better, the
  control;
- `judge`: scores (rubric, response) without the question: a pattern matcher.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer

from ...evaluation.coverage import TransformersSampler, coverage_report
from ...evolm.diagnostics import net_signal
from ...evolm.trainer import PHASE_INFO_FILE, format_other_role, stage_index
from ...tasks.arithmetic import Problem, extract_answer, problem
from . import toy
from .gates import Gate, check_gates, format_gates, gates
from .settings import DEMO_MODELS, EVOLM_DEMO, JUDGE_MODEL, PASS_AT_K, EvolmDemoSettings
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


def held_out_measurements(
    model, tokenizer, settings: EvolmDemoSettings = EVOLM_DEMO, readings: list[str] | None = None
) -> dict[str, float]:
    """The verifier's measurements on the first `num_held_out` test problems: the policy's greedy accuracy, Pass@k,
    right-reading rate c/(c+m) and slip rate, and what its rubrics state (greedy, and sampled at the rubric
    temperature as the policy phases draw them). `readings`: the problems' `greedy_readings`, when the caller has
    them already."""
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
    if readings is None:
        readings = greedy_readings(model, tokenizer, problems, settings.eval_seed)
    correct, misread = readings.count("correct"), readings.count("misread")
    measurements = {"greedy_accuracy": coverage.greedy_accuracy}
    measurements |= {f"pass@{k}": value for k, value in coverage.pass_at_k.items()}
    measurements["right_reading"] = correct / max(correct + misread, 1)
    measurements["slip_rate"] = readings.count("slip") / len(readings)
    for label, temperature in (("greedy", 0.0), ("sampled", settings.rubric_temperature)):
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


def greedy_readings(model, tokenizer, problems: Sequence[Problem], seed: int) -> list[str]:
    """The verifier's reading (`toy.answer_reading`) of the model's greedy answer to each problem."""
    prompts = [DEMO_PROMPTS.policy.format(question=p.question) for p in problems]
    greedy = sample_completions(model, tokenizer, prompts, 0.0, 8, seed)
    return [toy.answer_reading(p, text) for p, text in zip(problems, greedy, strict=True)]


def sample_completions(
    model, tokenizer, prompts, temperature: float, max_new_tokens: int, seed: int, num_samples: int = 1
) -> list[str]:
    """`num_samples` completions of each prompt (text, prompt by prompt), greedy at temperature 0, with
    `model.generate` from `seed`."""
    prompt_ids = [tokenizer(prompt)["input_ids"] for prompt in prompts]
    sampled = TransformersSampler(model, tokenizer).sample(prompt_ids, num_samples, temperature, max_new_tokens, seed)
    return [tokenizer.decode(ids, skip_special_tokens=True) for completions in sampled for ids in completions]


# Rubrics the gates sample per question: the answers they are read against are greedy, so the sampled rubric is the
# net signal's only noise, about ±0.03 with one rubric per question on 256 questions, 8 samples divide it by √8.
GATE_RUBRIC_SAMPLES = 8


def measure_arm(
    model, tokenizer, problems: Sequence[Problem], rubric_temperature: float, seed: int,
    rubric_samples: int = GATE_RUBRIC_SAMPLES,
) -> dict:  # fmt: skip
    """What the gates read of one arm on `problems` (its training questions): rubric validity (greedy, and sampled at
    `rubric_temperature`, `rubric_samples` per question), greedy answer accuracy, and the net signal of its sampled
    rubrics against its greedy answers (see `gates`)."""
    rubric_prompts = [toy.DEMO_PROMPTS.rubric_generation.format(question=p.question) for p in problems]
    greedy_rubrics = sample_completions(model, tokenizer, rubric_prompts, 0.0, 32, seed)
    sampled_rubrics = sample_completions(
        model, tokenizer, rubric_prompts, rubric_temperature, 32, seed, rubric_samples
    )
    answer_right = [reading == "correct" for reading in greedy_readings(model, tokenizer, problems, seed)]
    sampled_problems = [p for p in problems for _ in range(rubric_samples)]
    rubric_right = [
        toy.rubric_reading(p, r) == "correct" for p, r in zip(sampled_problems, sampled_rubrics, strict=True)
    ]

    def valid_rate(rubrics, asked):
        readings = [toy.rubric_reading(p, rubric) for p, rubric in zip(asked, rubrics, strict=True)]
        return 1 - readings.count("invalid") / len(readings)

    return {
        "rubric_valid_greedy": valid_rate(greedy_rubrics, problems),
        "rubric_valid_sampled": valid_rate(sampled_rubrics, sampled_problems),
        "answer_accuracy": sum(answer_right) / len(answer_right),
        "rubric_accuracy_sampled": sum(rubric_right) / len(rubric_right),
        "net_signal": net_signal(rubric_right, [right for right in answer_right for _ in range(rubric_samples)]),
    }


def measure_gates(
    settings: EvolmDemoSettings = EVOLM_DEMO, arms: dict[str, Path] = DEMO_MODELS
) -> tuple[dict[str, dict], list[Gate]]:
    """Both arms (the folders of `joint` and `null`) measured before any training (`measure_arm`) on the training
    questions, at least the demo's 256 (a shorter run trains on the first of them), and their gates."""
    problems = [problem("train", index) for index in range(max(settings.num_train, EVOLM_DEMO.num_train))]
    measured = {}
    for name in ("joint", "null"):
        model, tokenizer = AutoModelForCausalLM.from_pretrained(arms[name]), AutoTokenizer.from_pretrained(arms[name])
        measured[name] = measure_arm(model, tokenizer, problems, settings.rubric_temperature, settings.eval_seed)
    return measured, gates(measured["joint"], measured["null"])


def other_role_lines(run_dir: Path) -> list[str]:
    """One line per phase of an EVOLM run: the health of the role it did not train, start -> after (`phase.json`),
    as the trainer logs it."""
    lines = []
    for stage in sorted(run_dir.glob("stage-*"), key=stage_index):
        other = json.loads((stage / PHASE_INFO_FILE).read_text()).get("other_role", {})
        lines.append(f"  {stage.name}: {format_other_role(other) or 'not measured'}")
    return lines


@dataclass
class EvolmDemoResult:
    gates: list[Gate]
    before: dict[str, dict[str, float]]  # model name -> measurements
    after: dict[str, dict[str, float]]
    output_dir: str


def format_side_by_side(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]], title: str) -> str:
    """One row per measurement; for each model, before, after and the change."""
    names = list(before)
    header = f"{title:<26}" + "".join(f"{name + ' before':>14}{'after':>8}{'change':>9}" for name in names)
    rows = [header]
    for key in before[names[0]]:
        cells = "".join(
            f"{before[n][key]:>14.3f}{after[n][key]:>8.3f}{after[n][key] - before[n][key]:>+9.3f}" for n in names
        )
        rows.append(f"{key:<26}{cells}")
    return "\n".join(rows)


def train_and_measure(job: tuple, sharing: int = 1) -> tuple[dict, dict, list[str]]:
    """One arm of the demo, `job = (name, settings, output_dir, seed)`: its held-out measurements before and after
    EVOLM, and what each phase did to the other role. `sharing` processes share the machine's threads."""
    import torch

    name, settings, output_dir, seed = job
    torch.set_num_threads(max(1, torch.get_num_threads() // sharing))
    tokenizer = AutoTokenizer.from_pretrained(DEMO_MODELS[name])
    before = held_out_measurements(AutoModelForCausalLM.from_pretrained(DEMO_MODELS[name]), tokenizer, settings)
    final = train_evolm(DEMO_MODELS[name], settings, output_dir, seed)
    after = held_out_measurements(AutoModelForCausalLM.from_pretrained(final), tokenizer, settings)
    return before, after, other_role_lines(Path(output_dir))


def run_evolm_demo(
    output_dir: str | None = None,
    settings: EvolmDemoSettings = EVOLM_DEMO,
    models: Sequence[str] = ("joint", "null"),
    seed: int = 0,
    log: Callable[[str], None] = print,
    processes: int | None = None,
) -> EvolmDemoResult:
    """The gates of the two arms (a `GateFailure` stops the demo before any training when one fails), then EVOLM on
    each embedded model in `models` (in `processes` processes at once, by default one per model up to the CPU
    count), measured on held-out problems before and after, side by side."""
    output_dir = output_dir or tempfile.mkdtemp(prefix="trl-es-evolm-demo-")
    log(
        f"EVOLM demo: policy {settings.policy_method.upper()}, rubrics {settings.rubric_method.upper()}, schedule "
        f"{settings.schedule}, {settings.rounds} rounds "
        f"of {settings.policy_steps} policy + {settings.rubric_steps} rubric steps, pairs {settings.pair_weights}, "
        f"{settings.rubric_reward} rubric reward, {settings.num_train} training questions (no answers)."
    )
    log(
        "The arms, from one shared checkpoint: answers misread 3 of 6 question templates 90% of the time (10% "
        "elsewhere); joint rubrics misread 25% at random, null rubrics by the answers' rule. The judge reads rubric "
        "and response only."
    )
    _, found = measure_gates(settings)
    questions = max(settings.num_train, EVOLM_DEMO.num_train)
    log(f"\nGates, before any training ({questions} training questions, rubrics at temperature "
        f"{settings.rubric_temperature}):\n{format_gates(found)}")  # fmt: skip
    check_gates(found)
    result = EvolmDemoResult(found, {}, {}, output_dir)
    jobs = [(name, settings, str(Path(output_dir) / name), seed) for name in models]
    processes = min(len(jobs), processes or os.cpu_count() or 1)
    log(f"\nTraining {', '.join(models)} ({processes} at a time)...")
    if processes > 1:  # the arms are independent: one process each (spawned: no inherited torch state)
        with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn")) as pool:
            outcomes = list(pool.map(train_and_measure, jobs, [processes] * len(jobs)))
    else:
        outcomes = [train_and_measure(job) for job in jobs]
    for name, (before, after, lines) in zip(models, outcomes, strict=True):
        result.before[name], result.after[name] = before, after
        log(f"\n{name}: what each phase did to the role it did not train (training questions)\n" + "\n".join(lines))
    log(f"\n{format_side_by_side(result.before, result.after, f'{settings.num_held_out} held-out')}")
    log(
        f"\npass@k: {max(PASS_AT_K)} samples per problem at temperature 1. right_reading = c/(c+m), correct over "
        "correct-or-misread greedy answers; slip_rate: neither. Models: " + output_dir
    )
    return result
