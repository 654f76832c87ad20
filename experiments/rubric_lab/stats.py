"""The rubric lab's intervals: a two-level bootstrap over runs and held-out problems, paired between methods.

A run is one (pretraining seed, training seed); each records its greedy correctness on every held-out problem. One
bootstrap draw resamples the runs and, independently, the problems (both with replacement), and averages; a
comparison of two methods draws the same runs and problems for both (a paired difference: run `p/s` of one against
run `p/s` of the other), so that what they share (the arms, the problems' difficulty) cancels. The base model is not
trained, so its runs of one pretraining seed are one measurement (`jobs`). The standard error is the draws' standard
deviation, the interval their 2.5 and 97.5 percentiles. With few runs the run level is coarse: it is resampled all
the same, so that a difference carried by one run shows as uncertain.
"""

from __future__ import annotations

import numpy as np

from experiments.rubric_lab.settings import METHODS
from trl_es.evaluation.intervals import bootstrap_interval

# A difference counts when its mean exceeds this many standard errors (the goal)
STANDARD_ERRORS = 2


def run_correctness(by_run: dict[str, dict], keys: list[str]) -> np.ndarray:
    """`(runs, problems)`: the greedy correctness of the runs `keys` ("<pretraining seed>/<training seed>")."""
    return np.array([by_run[key]["greedy_correct"] for key in keys], dtype=float)


def bootstrap(values: np.ndarray, draws: int, seed: int = 0) -> dict:
    """Mean, standard error and 95% interval of `values` (`(runs, problems)`) under the two-level bootstrap (the
    library's, `trl_es.evaluation.intervals`, which `trl-es analyze compare` uses too)."""
    return bootstrap_interval(values, draws, seed).as_dict()


def accuracy_interval(by_run: dict[str, dict], draws: int) -> dict:
    """One method's held-out greedy accuracy, with its standard error and interval."""
    return bootstrap(run_correctness(by_run, sorted(by_run)), draws)


def paired_difference(by_run: dict[str, dict], baseline_by_run: dict[str, dict], draws: int) -> dict:
    """Accuracy of a method minus a baseline's, paired by run and problem: mean, standard error, interval, and
    `above` = the mean exceeds `STANDARD_ERRORS` standard errors."""
    if set(by_run) != set(baseline_by_run):
        raise ValueError(
            f"Cannot pair runs {sorted(by_run)} with a baseline's runs {sorted(baseline_by_run)}: run both methods "
            "on the same pretraining and training seeds."
        )
    keys = sorted(by_run)
    found = bootstrap(run_correctness(by_run, keys) - run_correctness(baseline_by_run, keys), draws)
    return {**found, "above": found["mean"] > STANDARD_ERRORS * found["se"]}


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


def template_groups(num_problems: int) -> dict[str, np.ndarray]:
    """The held-out problems (`problem("test", i)`, as the jobs measure them) by template: `hard`, the templates that
    the arms' answers misread nine times in ten (where `joint`'s rubrics know better), and `easy`, the others (where
    its rubrics, misreading one in four, know worse than the answers' one in ten)."""
    from trl_es.demo.evolm.pretrain_arms import EASY_MISREAD, answer_misread_rate
    from trl_es.tasks.arithmetic import problem

    hard = np.array([answer_misread_rate(problem("test", i).question) > EASY_MISREAD for i in range(num_problems)])
    return {"hard": hard, "easy": ~hard}


def template_differences(runs: dict, draws: int) -> dict:
    """`found[model][method][group]`: accuracy minus the base model's on the held-out problems of each template group
    (`template_groups`), paired by run and problem as `paired_difference`."""
    found = {}
    for model, by_method in runs.items():
        if "base" not in by_method:
            continue
        base = by_method["base"]
        num_problems = len(next(iter(base.values()))["greedy_correct"])
        groups = template_groups(num_problems)
        found[model] = {}
        for method, by_run in by_method.items():
            if method == "base":
                continue
            keys = sorted(by_run)
            differences = run_correctness(by_run, keys) - run_correctness(base, keys)
            found[model][method] = {group: bootstrap(differences[:, kept], draws) for group, kept in groups.items()}
    return found
