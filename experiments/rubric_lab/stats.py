"""The rubric lab's intervals: a two-level bootstrap over pretraining seeds and held-out problems, paired between
methods.

A run is one (pretraining seed, training seed); each records its greedy correctness on every held-out problem. A
method's accuracy on a pretraining seed is the mean over its training seeds. One bootstrap draw resamples the
pretraining seeds and, independently, the problems (both with replacement), and averages; a comparison of two
methods draws the same seeds and problems for both (a paired difference), so that what the two share (the arms,
the problems' difficulty) cancels. The standard error is the draws' standard deviation, the interval their 2.5 and
97.5 percentiles. With 3 pretraining seeds the seed level is coarse: it is resampled all the same, so that a
difference driven by one pair of arms shows as uncertain.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from experiments.rubric_lab.settings import METHODS


def per_seed_correctness(by_run: dict[str, dict]) -> np.ndarray:
    """`(pretraining seeds, problems)`: each pretraining seed's greedy correctness averaged over its training seeds,
    from `{"<pretraining seed>/<training seed>": run}`."""
    grouped = defaultdict(list)
    for key, run in by_run.items():
        grouped[key.split("/")[0]].append(run["greedy_correct"])
    return np.array([np.mean(grouped[seed], axis=0) for seed in sorted(grouped, key=int)])


def bootstrap(values: np.ndarray, draws: int, seed: int = 0) -> dict:
    """Mean, standard error and 95% interval of `values` (`(seeds, problems)`) under the two-level bootstrap."""
    rng = np.random.default_rng(seed)
    seeds, problems = values.shape
    picked_seeds = rng.integers(seeds, size=(draws, seeds))
    picked_problems = rng.integers(problems, size=(draws, 1, problems))
    means = np.take_along_axis(values[picked_seeds], picked_problems, axis=2).mean(axis=(1, 2))
    low, high = np.percentile(means, [2.5, 97.5])
    return {"mean": float(values.mean()), "se": float(means.std(ddof=1)), "ci": [float(low), float(high)]}


def accuracy_interval(by_run: dict[str, dict], draws: int) -> dict:
    """One method's held-out greedy accuracy, with its standard error and interval."""
    return bootstrap(per_seed_correctness(by_run), draws)


def paired_difference(by_run: dict[str, dict], baseline_by_run: dict[str, dict], draws: int) -> dict:
    """Accuracy of a method minus a baseline's, paired by pretraining seed and problem: mean, standard error,
    interval, and `above` = the mean exceeds two standard errors."""
    method, baseline = per_seed_correctness(by_run), per_seed_correctness(baseline_by_run)
    if method.shape != baseline.shape:
        raise ValueError(
            f"Cannot pair runs over {method.shape} (pretraining seeds, problems) with a baseline over "
            f"{baseline.shape}: run both methods on the same pretraining seeds and held-out problems."
        )
    found = bootstrap(method - baseline, draws)
    return {**found, "above": found["mean"] > 2 * found["se"]}


def lab_intervals(runs: dict, draws: int) -> dict:
    """`intervals[model]`: every method's `accuracy`, its `vs_base` difference and, for the methods with rubric
    phases, `vs_static`: what the lab's goal reads (`experiments.rubric_lab.report.goal_section`)."""
    intervals = {}
    for model, by_method in runs.items():
        intervals[model] = {}
        for method, by_run in by_method.items():
            found = {"accuracy": accuracy_interval(by_run, draws)}
            if method != "base" and "base" in by_method:
                found["vs_base"] = paired_difference(by_run, by_method["base"], draws)
            if has_rubric_phases(method) and "static" in by_method:
                found["vs_static"] = paired_difference(by_run, by_method["static"], draws)
            intervals[model][method] = found
    return intervals


def has_rubric_phases(method: str) -> bool:
    """EVOLM methods that train the rubrics too (the goal compares them with static rubrics)."""
    changes = METHODS.get(method)
    return changes is not None and changes.get("schedule") != "static"
