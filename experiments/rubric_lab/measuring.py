"""Measuring a rubric-lab model on held-out problems with the verifier and the demo's judge, what its EVOLM phases
logged, and the summary of the measurements over runs."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from experiments.harness import spread
from experiments.rubric_lab.reward_model import reward_model_reward
from experiments.rubric_lab.settings import RubricLabSettings


def measure(
    settings: RubricLabSettings, final: Path, judge, reward_model: Path | None
) -> tuple[dict[str, float], list[int]]:
    """The demo's held-out measurements, the rubric separation and, for `scalar-rm`, the reward model's mean reward
    of the greedy held-out answers; and 1 where the greedy answer to a held-out problem is right, else 0 (what the
    paired bootstrap resamples, `experiments.rubric_lab.stats`)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_es.demo.evolm import toy
    from trl_es.demo.evolm.run import greedy_readings, held_out_measurements, sample_completions
    from trl_es.evolm.rubrics import RubricError, parse_rubric
    from trl_es.tasks.arithmetic import problem

    model, tokenizer = AutoModelForCausalLM.from_pretrained(final).eval(), AutoTokenizer.from_pretrained(final)
    demo = settings.demo
    held_out = [problem("test", index) for index in range(demo.num_held_out)]
    readings = greedy_readings(model, tokenizer, held_out, demo.eval_seed)
    measurements = held_out_measurements(model, tokenizer, demo, readings)
    problems = [p for p in held_out if p.answer != p.misread_answer]
    rubric_prompts = [toy.DEMO_PROMPTS.rubric_generation.format(question=p.question) for p in problems]
    rubrics = sample_completions(model, tokenizer, rubric_prompts, 0.0, demo.max_completion_length, 0)
    items = []
    for p, rubric in zip(problems, rubrics, strict=True):
        try:  # the judge reads a rubric as the policy reward passes it: re-serialised
            rubric_json = parse_rubric(rubric, toy.DEMO_RULES).to_json()
        except RubricError:
            continue  # an invalid rubric separates nothing
        items += [("", rubric_json, f" {p.answer}"), ("", rubric_json, f" {p.misread_answer}")]
    scores = judge.score_batch(items)
    separated = sum(1 for a, b in zip(scores[::2], scores[1::2], strict=True) if None not in (a, b) and a > b)
    measurements["rubric_separation"] = separated / len(problems)
    measurements["judge_failure_rate"] = sum(score is None for score in scores) / max(len(scores), 1)
    if reward_model is not None:
        prompts = [toy.DEMO_PROMPTS.policy.format(question=p.question) for p in problems]
        answers = sample_completions(model, tokenizer, prompts, 0.0, 8, 0)
        rewards = reward_model_reward(reward_model)(prompts, answers, [p.question for p in problems])
        measurements["rm_reward"] = statistics.fmean(rewards)
    return measurements, [int(reading == "correct") for reading in readings]


def phase_history(run_dir: Path) -> list[dict]:
    """Every EVOLM phase's `phase.json` under `run_dir`, in the order they ran (none for methods without phases):
    what the phase started from (`diagnostics`) and how it left both roles (`after`)."""
    from trl_es.evolm.trainer import PHASE_INFO_FILE, stage_index

    files = sorted(run_dir.glob(f"stage-*/{PHASE_INFO_FILE}"), key=lambda path: stage_index(path.parent))
    return [json.loads(path.read_text()) for path in files]


def summarize(runs: dict) -> dict:
    """`summary[model][method][metric]`: mean, std and the values over the runs (pretraining x training seeds)."""
    summary = {}
    for model, by_method in runs.items():
        summary[model] = {}
        for method, by_run in by_method.items():
            metrics = list(next(iter(by_run.values()))["held_out"])
            summary[model][method] = {m: spread([r["held_out"][m] for r in by_run.values()]) for m in metrics}
    return summary
