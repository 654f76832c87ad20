"""The coverage lab's intervals and paired tests (`trl_es.evaluation.intervals`): every method against GRPO and the
base at greedy accuracy and Pass@1/4/16, and the lab's goal read from them.

A method's values are `(seeds, problems)`: its runs, one per seed, on the same held-out problems. A difference of two
methods is paired by seed and problem (a two-level bootstrap that resamples the same seeds and problems for both); the
base is trained by nobody, so its one measurement stands for every seed. The p-value is the paired sign-flip test over
problems of the per-problem difference averaged over seeds (it treats the seeds as fixed: the interval is the measure
that includes the seeds' spread).
"""

from __future__ import annotations

import numpy as np

from experiments.harness import compared
from trl_es.evaluation.metrics import pass_at_k

COMPARED_KS = (1, 4, 16)
DRAWS = 4000


def per_problem(result: dict, metric: str, samples: int) -> np.ndarray | None:
    """One run's per-problem `greedy` correctness or `pass@k` (from its per-problem success rates); None where the
    results file did not record it (greedy correctness was first recorded per problem with the equal-seconds lab)."""
    held_out = result["held_out"]
    if metric == "greedy":
        return np.array(held_out["greedy_correct"]) if "greedy_correct" in held_out else None
    k = int(metric[5:])
    return np.array([pass_at_k(samples, round(p * samples), k) for p in held_out["success_probs"]])


def method_values(results: dict, method: str, metric: str) -> np.ndarray | None:
    samples, seeds = results["settings"]["samples_per_prompt"], [str(s) for s in results["settings"]["seeds"]]
    by_seed = {str(seed): result for seed, result in results["runs"][method].items()}
    runs = [by_seed.get(seed, next(iter(by_seed.values()))) for seed in seeds]  # the base: one run for all seeds
    values = [per_problem(run, metric, samples) for run in runs]
    return None if any(v is None for v in values) else np.stack(values)


def metrics_compared(results: dict) -> list[str]:
    """Greedy accuracy where it was recorded per problem, and Pass@k for the compared k the samples allow."""
    greedy = method_values(results, "base", "greedy") is not None
    return (["greedy"] if greedy else []) + [f"pass@{k}" for k in compared_ks(results)]


def compared_ks(results: dict) -> list[int]:
    return [k for k in COMPARED_KS if k <= results["settings"]["samples_per_prompt"]]


def comparisons(results: dict, baseline: str, seed: int = 0) -> dict[str, dict[str, dict]]:
    """`found[method][metric]`: the method's interval and its paired difference from `baseline` (with `p`)."""
    found = {}
    for method in results["runs"]:
        found[method] = {}
        for metric in metrics_compared(results):
            base = method_values(results, baseline, metric) if method != baseline else None
            found[method][metric] = compared(method_values(results, method, metric), base, DRAWS, seed)
    return found


def goal(results: dict, against_grpo: dict) -> dict[str, bool]:
    """The equal-wall-clock goal: ES within one standard error of GRPO at Pass@1, above it (in the mean) at every k
    from 4 to the samples per problem, and ES→GRPO or GRPO→ES the best Pass@16 (the largest compared k) of all."""
    pass_1 = against_grpo["es"]["pass@1"]["difference"]
    ks = range(4, results["settings"]["samples_per_prompt"] + 1)
    gaps = [method_values(results, "es", f"pass@{k}").mean() - method_values(results, "grpo", f"pass@{k}").mean()
            for k in ks]  # fmt: skip
    k_max = max(compared_ks(results))
    best = max(against_grpo, key=lambda method: against_grpo[method][f"pass@{k_max}"]["interval"]["mean"])
    return {
        "ES within one standard error of GRPO at Pass@1": pass_1["mean"] >= -pass_1["se"],
        "ES above GRPO at every k ≥ 4": all(gap > 0 for gap in gaps),
        f"ES→GRPO or GRPO→ES the best Pass@{k_max}": best in ("es-then-grpo", "grpo-then-es"),
    }
