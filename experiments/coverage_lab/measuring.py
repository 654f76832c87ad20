"""Measuring a coverage-lab model: held-out accuracy, Pass@k, Maj@k and entropy (the demo's `held_out_report`), the
JS diversity of an ES population around it, and Pass@1 of its sparsified copies."""

from __future__ import annotations

import statistics
from pathlib import Path

import torch

from experiments.coverage_lab.settings import ALL_KS, MAJ_KS, SPARSITY_PERCENTS, LabSettings
from trl_es.core.noise import Member, derive_seed
from trl_es.demo.run import DEMO_MODEL, held_out_report
from trl_es.evaluation.metrics import js_diversity, pass_at_k
from trl_es.tasks.arithmetic import arithmetic_dataset, extract_answer


def load_model(path: str | Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), AutoTokenizer.from_pretrained(path)


def held_out_metrics(settings: LabSettings, model_dir: str | Path, num_problems: int | None = None) -> dict:
    """The demo's `held_out_report` on the first `num_problems` test problems (`samples_per_prompt` samples at
    temperature 1), with Pass@k for every k from 1 to `samples_per_prompt` from the per-problem success counts."""
    model, tokenizer = load_model(model_dir)
    report = held_out_report(
        model,
        tokenizer,
        num_problems or settings.num_held_out,
        ks=MAJ_KS,
        samples_per_prompt=settings.samples_per_prompt,
        max_new_tokens=settings.max_completion_length,
        seed=settings.eval_seed,
    )
    n = settings.samples_per_prompt
    counts = [round(p * n) for p in report.success_probs]
    ks = [k for k in ALL_KS if k <= n]
    return {
        "greedy_accuracy": report.greedy_accuracy,
        "greedy_correct": report.greedy_correct,  # per problem: paired comparisons resample it
        "pass@k": {k: sum(pass_at_k(n, c, k) for c in counts) / len(counts) for k in ks},
        "maj@k": dict(report.maj_at_k),
        "entropy": report.token_entropy,
        "success_probs": report.success_probs,
        "num_problems": report.num_prompts,
    }


@torch.no_grad()
def population_js_diversity(settings: LabSettings, model_dir: str | Path, seed: int) -> dict:
    """JS diversity of an ES population around the model in `model_dir`: `js_population` members θ + σε (seeded
    from `seed`) each sample `js_samples` answers at temperature 1 to `js_problems` held-out problems (the same
    sampling seed for every member); per-problem member success rates → `js_diversity`, averaged over problems."""
    from trl_es.core.master import MasterWeights
    from trl_es.evaluation.coverage import TransformersSampler

    model, tokenizer = load_model(model_dir)
    parameters = dict(model.named_parameters())
    master = MasterWeights(parameters, settings.sigma)
    test = arithmetic_dataset("test", settings.js_problems)
    prompt_ids = [tokenizer(prompt, add_special_tokens=False)["input_ids"] for prompt in test["prompt"]]
    sampler = TransformersSampler(model, tokenizer)
    success = []  # success[member][problem]
    for index in range(settings.js_population):
        for name, value in master.perturbed(Member(derive_seed("lab-js", seed, index))):
            parameters[name].copy_(value)
        completions = sampler.sample(
            prompt_ids, settings.js_samples, 1.0, settings.max_completion_length, settings.eval_seed
        )
        success.append(
            [
                statistics.fmean(extract_answer(text) == answer for text in tokenizer.batch_decode(ids, True))
                for ids, answer in zip(completions, test["answer"], strict=True)
            ]
        )
    per_problem = [js_diversity([member[i] for member in success]) for i in range(len(prompt_ids))]
    return {
        "js_diversity": statistics.fmean(per_problem),
        "mean_success": statistics.fmean(p for member in success for p in member),
    }


def sparsified_metrics(settings: LabSettings, tuned_dir: Path, work_dir: Path) -> dict:
    """Pass@1 and greedy accuracy (on `num_sparse_held_out` problems) of `tuned_dir` with the p% smallest |Δθ| reset
    to the base, for p in SPARSITY_PERCENTS, and of the dense model on the same problems."""
    from trl_es.evaluation.analysis import sparsify

    results = {}
    paths = sparsify(DEMO_MODEL, tuned_dir, SPARSITY_PERCENTS, work_dir)
    for percent, path in zip((0, *SPARSITY_PERCENTS), (tuned_dir, *paths), strict=True):
        metrics = held_out_metrics(settings, path, settings.num_sparse_held_out)
        results[percent] = {"pass@1": metrics["pass@k"][1], "greedy_accuracy": metrics["greedy_accuracy"]}
    return results
