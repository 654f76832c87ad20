"""What each EVOLM phase logs about the model it starts from, i.e. about how the previous phase left both roles.

Without ground truth (always):
- `rubric_valid_rate`: the model's rubrics (at `rubric_temperature`) that are valid rubrics;
- `rubric_answer_agreement`: the judge's mean score of the model's answer to a question under its own rubric for that
  question (over the valid rubrics): how far the two roles agree.

With an [`EvalVerifier`], for evaluation only (it never reaches a reward, a dataset or a training step):
- `answer_accuracy`, `rubric_accuracy`: the sampled answers and rubrics that are right;
- `net_signal`: P(rubric right, answer wrong) − P(rubric wrong, answer right) on the same question, the only signal
  from which a policy phase can learn (positive: the rubrics know better than the answers);
- `held_out_accuracy`: the greedy answers to the verifier's held-out questions that are right;
- `pair_balance` (rubric phases): per pair source, how many pairs prefer a right answer to a wrong one
  (`right_over_wrong`) and the reverse (`wrong_over_right`): a source whose pairs carry no correctness shows ~1:1.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .judges import Judge, score_all
from .pairs import Pair
from .rubrics import RubricError, RubricRules, parse_rubric


@dataclass(frozen=True)
class EvalVerifier:
    """Ground truth for measuring an EVOLM run, never for training it.

    Args:
        answer_is_correct (`Callable[[str, str], bool]`):
            `(question, answer text) -> whether the answer is right`.
        rubric_is_correct (`Callable[[str, str], bool]`, *optional*):
            `(question, rubric text) -> whether the rubric asks for the right answer`; without it, no rubric accuracy
            or net signal is measured.
        held_out_questions (`Sequence[str]`, *optional*):
            Questions no phase trains on: `held_out_accuracy`, and the probe of the reward-hacking guard.
    """

    answer_is_correct: Callable[[str, str], bool]
    rubric_is_correct: Callable[[str, str], bool] | None = None
    held_out_questions: Sequence[str] = ()


def phase_diagnostics(
    questions: Sequence[str],
    answers: Sequence[str],
    rubrics: Sequence[str],
    judge: Judge,
    rules: RubricRules,
    verifier: EvalVerifier | None = None,
    pairs: Sequence[Pair] | None = None,
    answer_greedily: Callable[[list[str]], list[str]] | None = None,
) -> dict:
    """The diagnostics of one phase's starting model (see the module docstring) from its answers and rubrics to the
    training `questions`, its rubric phase's `pairs`, and `answer_greedily` (questions -> the model's greedy
    answers) for the held-out questions."""
    parsed = [_parsed(rubric, rules) for rubric in rubrics]
    valid = [row for row, rubric in enumerate(parsed) if rubric is not None]
    agreement = score_all(judge, [(questions[row], parsed[row].to_json(), answers[row]) for row in valid])
    scored = [score for score in agreement if score is not None]
    found = {
        "rubric_valid_rate": len(valid) / len(rubrics) if rubrics else None,
        "rubric_answer_agreement": sum(scored) / len(scored) if scored else None,
    }
    if verifier is None:
        return found
    answer_right = [verifier.answer_is_correct(q, a) for q, a in zip(questions, answers, strict=True)]
    found["answer_accuracy"] = sum(answer_right) / len(answer_right) if answer_right else None
    if verifier.rubric_is_correct is not None:
        rubric_right = [verifier.rubric_is_correct(q, r) for q, r in zip(questions, rubrics, strict=True)]
        found["rubric_accuracy"] = sum(rubric_right) / len(rubric_right) if rubric_right else None
        found["net_signal"] = net_signal(rubric_right, answer_right) if rubric_right else None
    if pairs is not None:
        found["pair_balance"] = pair_balance(pairs, verifier)
    if answer_greedily is not None and verifier.held_out_questions:
        found["held_out_accuracy"] = held_out_accuracy(answer_greedily, verifier)
    return found


def net_signal(rubric_right: Sequence[bool], answer_right: Sequence[bool]) -> float:
    """P(rubric right, answer wrong) - P(rubric wrong, answer right) over the same questions."""
    signal = [int(r and not a) - int(a and not r) for r, a in zip(rubric_right, answer_right, strict=True)]
    return sum(signal) / len(signal)


def pair_balance(pairs: Sequence[Pair], verifier: EvalVerifier) -> dict[str, dict[str, int]]:
    """Per source: pairs that prefer a right answer to a wrong one, the reverse, and the rest."""
    balance: dict[str, dict[str, int]] = {}
    for pair in pairs:
        chosen = verifier.answer_is_correct(pair.question, pair.chosen)
        rejected = verifier.answer_is_correct(pair.question, pair.rejected)
        counts = balance.setdefault(pair.source, {"right_over_wrong": 0, "wrong_over_right": 0, "neither": 0})
        kind = "right_over_wrong" if chosen and not rejected else "wrong_over_right" if rejected and not chosen else ""
        counts[kind or "neither"] += 1
    return balance


def held_out_accuracy(answer_greedily: Callable[[list[str]], list[str]], verifier: EvalVerifier) -> float:
    """The fraction of the verifier's held-out questions that `answer_greedily` (questions -> answers) gets right."""
    questions = list(verifier.held_out_questions)
    answers = answer_greedily(questions)
    return sum(verifier.answer_is_correct(q, a) for q, a in zip(questions, answers, strict=True)) / len(questions)


def _parsed(rubric: str, rules: RubricRules):
    try:
        return parse_rubric(rubric, rules)
    except RubricError:
        return None
