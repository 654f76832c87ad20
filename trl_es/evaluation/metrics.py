"""The paper's coverage measurements as pure functions: Pass@k, Maj@k and the population's JS diversity.

Pass@k is Chen et al.'s unbiased estimator (arXiv 2107.03374): from n samples of which c are correct, the probability
that at least one of k samples drawn without replacement is correct. JS diversity is the verifier-projected
Jensen-Shannon divergence of a population (arXiv 2608.27351): H(mean p_i) - mean H(p_i) over the members' success
probabilities p_i on one prompt, with H the Bernoulli entropy in bits, so it lies in [0, 1].

The parameter shift (`es/param_distance`, ||theta - theta_0|| / ||theta_0||) needs the run's starting weights:
`StartingWeights` keeps them in a safetensors file and reads one tensor at a time, so the metric does not cost a copy
of the model in memory.
"""

from __future__ import annotations

import itertools
import math
import os
import random
import tempfile
import weakref
from collections import Counter
from collections.abc import Mapping, Sequence

import torch

from ..core.pass_at_k import pass_at_k  # noqa: F401  (re-exported: it lives in core, for ES's Pass@k fitness too)
from ..core.tensor_files import SafetensorsFile, TensorStream, write_safetensors


def _majority(answers: Sequence[str | None]) -> str | None:
    """The most frequent extracted answer (ties: the one seen first); None when no sample has an answer."""
    counts = Counter(answer for answer in answers if answer is not None)
    if not counts:
        return None
    best = max(counts.values())
    return next(answer for answer in answers if answer is not None and counts[answer] == best)


def maj_at_k(answers: Sequence[str | None], reference: str, k: int, max_subsets: int = 10_000, seed: int = 0) -> float:
    """Maj@k: the probability that the majority vote over k of the n samples is the reference answer.

    `answers` holds the extracted answer of each sample (None where the verifier found none; None never wins a vote).
    The vote is averaged over every k-subset of the n samples (so Maj@1 is the mean accuracy and Maj@n the vote over
    all samples), or over `max_subsets` random subsets drawn with a fixed `seed` when there are more.
    """
    n = len(answers)
    if not 1 <= k <= n:
        raise ValueError(f"k={k} with n={n} answers: Maj@k needs 1 <= k <= n. Draw at least k samples per prompt.")
    if math.comb(n, k) <= max_subsets:
        subsets = list(itertools.combinations(answers, k))
    else:
        rng = random.Random(seed)
        subsets = [rng.sample(list(answers), k) for _ in range(max_subsets)]
    return sum(_majority(subset) == reference for subset in subsets) / len(subsets)


def bernoulli_entropy(p: float) -> float:
    """Entropy in bits of a coin that lands heads with probability `p`."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p={p} is not a probability.")
    if p in (0.0, 1.0):
        return 0.0
    return -(p * math.log2(p) + (1 - p) * math.log2(1 - p))


def js_diversity(success_probs: Sequence[float]) -> float:
    """Verifier-projected JS diversity of a population on one prompt: H(mean p_i) - mean H(p_i), in bits.

    0 when every member succeeds equally often; 1 when half the members always succeed and half always fail.
    """
    if len(success_probs) == 0:
        raise ValueError("success_probs is empty: give one success probability per member.")
    mean = sum(success_probs) / len(success_probs)
    return bernoulli_entropy(mean) - sum(bernoulli_entropy(p) for p in success_probs) / len(success_probs)


def population_diversity(completion_rewards, num_generations: int, success_threshold: float = 0.0) -> float:
    """Mean over prompts of the members' JS diversity (in bits), from `(members, prompts * num_generations)` rewards
    whose `num_generations` consecutive completions answer one prompt: a member's success probability on a prompt is
    the fraction of its completions with a reward above `success_threshold`."""
    members, completions = completion_rewards.shape
    successes = (completion_rewards > success_threshold).float()
    success_probs = successes.view(members, completions // num_generations, num_generations).mean(dim=2).T
    return sum(js_diversity(row.tolist()) for row in success_probs) / len(success_probs)


class StartingWeights(SafetensorsFile):
    """Named tensors kept in a safetensors file instead of memory, read back one at a time (as CPU tensors, bitwise in
    the dtype they were written in): the run's starting weights, for `es/param_distance` and checkpoints.

    Writing and reading go through plain file I/O, tensor by tensor, so neither ever holds more than one tensor (nor
    maps the file into the process). Use [`StartingWeights.write`] or [`StartingWeights.resumed`] to create one.
    """

    @classmethod
    def write(cls, tensors: Mapping[str, torch.Tensor], path: str | os.PathLike | None = None) -> StartingWeights:
        """Write `tensors` (any device) to `path` as safetensors, one tensor at a time. Without `path`, the file is a
        new temporary one (under `TMPDIR`), removed when the returned object is garbage-collected."""
        owned = path is None
        path = _temporary_file() if owned else path
        write_safetensors(path, TensorStream.of(tensors))
        return cls._of(path, owned)

    @classmethod
    def resumed(cls, saved: SafetensorsFile) -> StartingWeights:
        """The starting weights a resumed checkpoint holds in `saved`, in a temporary file of the run's own (a
        checkpoint may be deleted during the run): a hard link to `saved` where `TMPDIR` is on its filesystem, else
        a copy. The checkpoints the run writes link `saved` first, so they rewrite nothing where they can."""
        path = _temporary_file()
        saved.write_to(path)
        weights = cls._of(path, owned=True)
        weights.copies.append(saved.path)  # the file they were linked or copied from
        return weights

    @classmethod
    def _of(cls, path: str | os.PathLike, owned: bool) -> StartingWeights:
        weights = cls(path)
        if owned:
            weakref.finalize(weights, _remove_file, str(path))
        return weights


def _temporary_file() -> str:
    handle, path = tempfile.mkstemp(prefix="trl-es-starting-weights-", suffix=".safetensors")
    os.close(handle)
    return path


def _remove_file(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
