"""Bootstrap intervals and a paired sign-flip test over problems (and runs), as pure functions on arrays.

Values are per-problem measurements: a 1-D array (one checkpoint's greedy correctness, Pass@k or Maj@k on each
problem) or a `(runs, problems)` array (several training runs measured on the same problems). One bootstrap draw
resamples the problems with replacement and averages; with runs it also resamples the runs, independently of the
problems (a two-level bootstrap), so that a result carried by one run shows as uncertain. The standard error is the
draws' standard deviation, the interval their 2.5 and 97.5 percentiles (the percentile bootstrap).

A comparison of two checkpoints on the same problems is paired: the same draws resample both, which is the bootstrap
of the per-problem differences, so that what they share (each problem's difficulty) cancels. Its test is the paired
sign-flip (randomisation) test: under the null that tuned and base are exchangeable on every problem, each problem's
difference is as likely negated, and the p-value is the fraction of sign patterns whose mean difference is at least as
far from 0 as the observed one (two-sided). It enumerates every pattern when there are at most `draws` of them (an
exact p-value), and otherwise draws `draws` random patterns from `seed` (p = (1 + hits) / (1 + draws), never 0).
Everything is deterministic given the seed.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

DRAWS = 10_000
_DRAWS_PER_BLOCK = 1_000  # bounds the (draws, problems) index arrays held at once
_TOLERANCE = 1e-9  # relative: a flipped sum equal to the observed one up to rounding counts as "at least as far"


@dataclass(frozen=True)
class Interval:
    """A mean over problems with its bootstrap standard error and 95% interval `[low, high]`."""

    mean: float
    se: float
    low: float
    high: float

    def as_dict(self) -> dict:
        return {"mean": self.mean, "se": self.se, "ci": [self.low, self.high]}

    def format(self, signed: bool = False) -> str:
        """`0.467 [0.43, 0.50]`, or `+0.078 [+0.04, +0.11]` when `signed` (a difference)."""
        sign = "+" if signed else ""
        return f"{self.mean:{sign}.3f} [{self.low:{sign}.2f}, {self.high:{sign}.2f}]"


def bootstrap_means(values, draws: int = DRAWS, seed: int = 0) -> np.ndarray:
    """The means of `draws` bootstrap resamples of `values`: problems resampled for a 1-D array; runs and,
    independently, problems for a `(runs, problems)` array (the same problems for every run of a draw)."""
    values = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    if values.ndim == 2:
        runs, problems = values.shape
        picked_runs = rng.integers(runs, size=(draws, runs))
        picked_problems = rng.integers(problems, size=(draws, 1, problems))
        return np.take_along_axis(values[picked_runs], picked_problems, axis=2).mean(axis=(1, 2))
    if values.ndim != 1 or len(values) == 0:
        raise ValueError(f"values has shape {values.shape}: give one value per problem, or a (runs, problems) array.")
    blocks = [min(_DRAWS_PER_BLOCK, draws - start) for start in range(0, draws, _DRAWS_PER_BLOCK)]
    return np.concatenate(
        [values[rng.integers(len(values), size=(block, len(values)))].mean(axis=1) for block in blocks]
    )


def bootstrap_interval(values, draws: int = DRAWS, seed: int = 0) -> Interval:
    """Mean, standard error and 95% percentile interval of `values` (1-D per problem, or `(runs, problems)`)."""
    means = bootstrap_means(values, draws, seed)
    low, high = np.percentile(means, [2.5, 97.5])
    return Interval(float(np.mean(values)), float(means.std(ddof=1)), float(low), float(high))


def paired_interval(tuned, base, draws: int = DRAWS, seed: int = 0) -> Interval:
    """`tuned − base`, resampling the same problems (and runs) for both: the bootstrap of the differences."""
    tuned, base = np.asarray(tuned, dtype=float), np.asarray(base, dtype=float)
    if tuned.shape != base.shape:
        raise ValueError(
            f"Cannot pair values of shape {tuned.shape} with a base's of shape {base.shape}: measure both on the same "
            "problems (and runs)."
        )
    return bootstrap_interval(tuned - base, draws, seed)


def paired_comparison(tuned, base, draws: int = DRAWS, seed: int = 0) -> tuple[Interval, float]:
    """`tuned − base` paired: its bootstrap interval (`paired_interval`) and its sign-flip p-value over problems (for
    `(runs, problems)` values, of the per-problem difference averaged over runs, which treats the runs as fixed)."""
    differences = np.asarray(tuned, dtype=float) - np.asarray(base, dtype=float)
    per_problem = differences.mean(axis=0) if differences.ndim == 2 else differences
    return paired_interval(tuned, base, draws, seed), sign_flip_p_value(per_problem, draws, seed)


def sign_flip_p_value(differences, draws: int = DRAWS, seed: int = 0) -> float:
    """Two-sided p-value of the paired sign-flip test that the per-problem `differences` are centred on 0.

    Problems with a zero difference are the same under every flip, so only the m nonzero ones are flipped: all 2^m
    patterns when 2^m <= `draws` (exact), else `draws` random ones from `seed`. Identical measurements give 1.
    """
    differences = np.asarray(differences, dtype=float)
    if differences.ndim != 1 or len(differences) == 0:
        raise ValueError(f"differences has shape {differences.shape}: give one difference per problem.")
    nonzero = differences[differences != 0]
    if len(nonzero) == 0:
        return 1.0
    threshold = abs(nonzero.sum()) * (1 - _TOLERANCE)
    if 2 ** len(nonzero) <= draws:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=len(nonzero))))
        return float(np.mean(np.abs(signs @ nonzero) >= threshold))
    rng = np.random.default_rng(seed)
    hits = 0
    for start in range(0, draws, _DRAWS_PER_BLOCK):
        signs = rng.choice((1.0, -1.0), size=(min(_DRAWS_PER_BLOCK, draws - start), len(nonzero)))
        hits += int(np.sum(np.abs(signs @ nonzero) >= threshold))
    return (1 + hits) / (1 + draws)
