"""Preference pairs (question, chosen a+, rejected a−) built without labels from the model's own outputs, for EVOLM.

Three sources, after the EVOLM authors' data providers (`scripts/rubric_data_provider.py` in stellalisy/EvoLM):

- **temporal contrast** (`temporal`): a+ is the current policy's answer, a− an older checkpoint's answer to the same
  question from a [`ReplayBuffer`], aged `min_age`..`max_age` policy steps (20–100 by default: the authors'
  `gap20_100`);
- **inferred question** (`inferred`): the policy infers which question a+ answers, then answers that question: a−;
- **rubric-conditioned** (`rubric_conditioned`): a+ is answered with the rubric in the prompt, a− without it.

[`PairMixture`] splits the questions between the sources by weight. A pair whose two answers are equal up to
whitespace carries no preference: it is dropped and counted ([`PairStats`]).
"""

from __future__ import annotations

import math
import random
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from .prompts import Prompts, render
from .replay import ReplayBuffer

Generate = Callable[[list[str]], list[str]]
"""Prompts (rendered text) to one completion each, in order, through the trainer's generation path."""

SOURCES = ("temporal", "inferred", "rubric_conditioned")
# The default templates, shared as a default argument (the dataclass is frozen).
DEFAULT_PROMPTS = Prompts()

# Reasoning models think before answering; the inferred question must come from the answer, not from the reasoning,
# which often restates the question (the authors strip it too).
_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)


@dataclass(frozen=True)
class Pair:
    """A preference pair for the rubric phase: the judge should score `chosen` above `rejected` under a good rubric."""

    question: str
    chosen: str
    rejected: str
    source: str


@dataclass
class PairStats:
    """What one source did with its questions.

    Args:
        built (`int`): pairs returned.
        ties_dropped (`int`): pairs dropped because chosen and rejected were equal up to whitespace.
        fallbacks (`int`): questions that got no pair because temporal contrast found no answer in the age window;
            the fallback is to skip the question (no pair from another source, no answer outside the window).
    """

    built: int = 0
    ties_dropped: int = 0
    fallbacks: int = 0


def temporal_contrast(
    questions: Sequence[str], answers: Sequence[str], buffer: ReplayBuffer, step: int
) -> tuple[list[Pair], PairStats]:
    """Pairs of the current answer (chosen) and an older checkpoint's answer to the same question (rejected).

    Args:
        questions, answers (`Sequence[str]`): the questions and the current policy's answer to each.
        buffer ([`ReplayBuffer`]): the older answers; this function does not add the current ones.
        step (`int`): policy steps trained so far, against which the buffer measures ages.

    A question with no answer in the buffer's age window gets no pair (counted in `fallbacks`).
    """
    _check_lengths(questions=questions, answers=answers)
    older = [buffer.sample(question, step) for question in questions]
    fallbacks = sum(answer is None for answer in older)
    kept = [(q, a, old) for q, a, old in zip(questions, answers, older, strict=True) if old is not None]
    pairs, stats = _pairs([q for q, _, _ in kept], [a for _, a, _ in kept], [old for _, _, old in kept], "temporal")
    stats.fallbacks = fallbacks
    return pairs, stats


def inferred_question(
    questions: Sequence[str],
    answers: Sequence[str],
    generate: Generate,
    prompts: Prompts = DEFAULT_PROMPTS,
    infer: Generate | None = None,
) -> tuple[list[Pair], PairStats]:
    """Pairs of the current answer (chosen) and the policy's answer to the question it infers from that answer
    (rejected): two batched calls, `infer` (default: `generate`; the authors sample inference at a lower temperature
    than answers) to infer the questions, `generate` to answer them.

    Reasoning (`<think>...</think>`) is removed from the answer before inference and from the inferred question.
    """
    _check_lengths(questions=questions, answers=answers)
    inference_prompts = [render(prompts.infer_question, response=_without_thinking(answer)) for answer in answers]
    inferred = [_without_thinking(text) for text in _generate(infer or generate, inference_prompts)]
    rejected = _generate(generate, [render(prompts.policy, question=question) for question in inferred])
    return _pairs(questions, answers, rejected, "inferred")


def rubric_conditioned(
    questions: Sequence[str], rubrics: Sequence[str], generate: Generate, prompts: Prompts = DEFAULT_PROMPTS
) -> tuple[list[Pair], PairStats]:
    """Pairs of the policy's answer with the rubric in its prompt (chosen) and without it (rejected), from one
    `generate` call over both prompts of every question.

    Args:
        rubrics (`Sequence[str]`): the rubric (JSON text) written for each question.
    """
    _check_lengths(questions=questions, rubrics=rubrics)
    with_rubric = [
        render(prompts.policy_with_rubric, question=q, rubric=r) for q, r in zip(questions, rubrics, strict=True)
    ]
    without_rubric = [render(prompts.policy, question=question) for question in questions]
    completions = _generate(generate, with_rubric + without_rubric)
    return _pairs(questions, completions[: len(questions)], completions[len(questions) :], "rubric_conditioned")


@dataclass
class PairMixture:
    """A weighted mixture of the pair sources.

    Args:
        weights (`dict[str, float]`, *optional*):
            Relative weight of `"temporal"`, `"inferred"` and `"rubric_conditioned"` (equal by default; a missing
            source weighs 0). The authors' default is also equal weights (`replay_buffer:1,inferred_question:1,
            rubric:1`).
    """

    weights: dict[str, float] = field(default_factory=lambda: dict.fromkeys(SOURCES, 1.0))

    def __post_init__(self):
        self.weights = _checked_weights(self.weights)

    def assign(self, count: int, seed: int) -> list[str]:
        """The source of each of `count` questions: exactly the weights' shares (largest remainder), placed by a
        generator seeded with `seed`."""
        total = sum(self.weights.values())
        shares = {source: count * weight / total for source, weight in self.weights.items()}
        quotas = {source: math.floor(share) for source, share in shares.items()}
        by_remainder = sorted(SOURCES, key=lambda source: shares[source] - quotas[source], reverse=True)
        for source in by_remainder[: count - sum(quotas.values())]:
            quotas[source] += 1
        sources = [source for source in SOURCES for _ in range(quotas[source])]
        random.Random(seed).shuffle(sources)
        return sources

    def build(
        self,
        questions: Sequence[str],
        answers: Sequence[str],
        rubrics: Sequence[str],
        generate: Generate,
        buffer: ReplayBuffer,
        step: int,
        seed: int,
        prompts: Prompts = DEFAULT_PROMPTS,
        infer: Generate | None = None,
    ) -> tuple[list[Pair], dict[str, PairStats]]:
        """Pairs for `questions`, each question going to one source (see [`~PairMixture.assign`]); `generate` is
        called once per source and generation round, over all of its questions.

        Args:
            answers (`Sequence[str]`): the current policy's answer to each question (a+ of temporal and inferred).
            rubrics (`Sequence[str]`): the rubric of each question (for rubric-conditioned answers).
            buffer, step: the replay buffer and the policy step of temporal contrast.
            seed (`int`): seed of the assignment.
            infer (`Generate`, *optional*): how inferred-question pairs infer their questions (default: `generate`).

        Returns:
            The pairs, grouped by source in the order of `SOURCES`, each group in question order; and each source's
            [`PairStats`].
        """
        _check_lengths(questions=questions, answers=answers, rubrics=rubrics)
        assigned = self.assign(len(questions), seed)

        def take(column: Sequence[str], source: str) -> list[str]:
            return [entry for entry, entry_source in zip(column, assigned, strict=True) if entry_source == source]

        built = {
            "temporal": temporal_contrast(take(questions, "temporal"), take(answers, "temporal"), buffer, step),
            "inferred": inferred_question(
                take(questions, "inferred"), take(answers, "inferred"), generate, prompts, infer
            ),
            "rubric_conditioned": rubric_conditioned(
                take(questions, "rubric_conditioned"), take(rubrics, "rubric_conditioned"), generate, prompts
            ),
        }
        pairs = [pair for source in SOURCES for pair in built[source][0]]
        return pairs, {source: built[source][1] for source in SOURCES}


def check_pair_sources(weights: Mapping[str, float], schedule_needs_pairs_before_any_policy_step: bool) -> None:
    """Check a mixture's weights at configuration time.

    Raises `ValueError` when the weights are invalid, or when temporal contrast is the only source while the first
    rubric phase comes before any policy step: the replay buffer is then empty and no pair can be built. Warns when
    temporal contrast is one of several sources in that case (its share of that phase's questions gets no pair).
    """
    weights = _checked_weights(weights)
    if not schedule_needs_pairs_before_any_policy_step or weights["temporal"] == 0:
        return
    if all(weight == 0 for source, weight in weights.items() if source != "temporal"):
        raise ValueError(
            "Temporal contrast is the only pair source (pair_weights={'temporal': ...}), but the first rubric phase "
            "comes before any policy step: the replay buffer has no older answer to pair with. Give weight to "
            "'inferred' or 'rubric_conditioned', or use a schedule that runs a policy phase first (`coevolve`)."
        )
    warnings.warn(
        "The first rubric phase comes before any policy step, so temporal contrast finds no older answer there: its "
        "share of that phase's questions gets no pair (counted in PairStats.fallbacks).",
        stacklevel=2,
    )


# --------------------------------------------------------------------------------------------------------------------
# Helpers


def _pairs(
    questions: Sequence[str], chosen: Sequence[str], rejected: Sequence[str], source: str
) -> tuple[list[Pair], PairStats]:
    """The pairs of `source`, with ties (equal up to whitespace) dropped and counted."""
    pairs, stats = [], PairStats()
    for question, better, worse in zip(questions, chosen, rejected, strict=True):
        if _normalised(better) == _normalised(worse):
            stats.ties_dropped += 1
        else:
            pairs.append(Pair(question, better, worse, source))
    stats.built = len(pairs)
    return pairs, stats


def _generate(generate: Generate, prompts: list[str]) -> list[str]:
    """`generate(prompts)`, checked to give one completion per prompt; no call for no prompt."""
    if not prompts:
        return []
    completions = list(generate(prompts))
    if len(completions) != len(prompts):
        raise ValueError(
            f"generate returned {len(completions)} completions for {len(prompts)} prompts; it must return exactly "
            "one completion per prompt, in the prompts' order."
        )
    return completions


def _checked_weights(weights: Mapping[str, float]) -> dict[str, float]:
    """`weights` with every source present (0 when missing), or a `ValueError` saying what to fix."""
    if not isinstance(weights, Mapping):
        raise ValueError(f"pair weights must be a dict of source to weight, got {weights!r}.")
    unknown = sorted(set(weights) - set(SOURCES))
    if unknown:
        raise ValueError(f"Unknown pair source(s) {unknown} in {dict(weights)}; the sources are {list(SOURCES)}.")
    for source, weight in weights.items():
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight < 0:
            raise ValueError(f"The weight of pair source {source!r} must be a finite number >= 0, got {weight!r}.")
    if sum(weights.values()) <= 0:
        raise ValueError(f"The pair weights {dict(weights)} sum to 0; give at least one source a positive weight.")
    return {source: float(weights.get(source, 0.0)) for source in SOURCES}


def _check_lengths(**columns: Sequence[str]) -> None:
    lengths = {name: len(column) for name, column in columns.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"One entry per question is needed in each of {list(lengths)}; got the lengths {lengths}.")


def _normalised(text: str) -> str:
    return " ".join(text.split())


def _without_thinking(text: str) -> str:
    return _THINK_BLOCK.sub("", text).strip()


__all__ = [
    "SOURCES",
    "Generate",
    "Pair",
    "PairMixture",
    "PairStats",
    "ReplayBuffer",
    "check_pair_sources",
    "inferred_question",
    "rubric_conditioned",
    "temporal_contrast",
]
