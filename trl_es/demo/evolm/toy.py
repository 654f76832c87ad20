"""The EVOLM toy: the arithmetic task as question -> answer, question -> rubric, and (rubric, response) -> score.

The texts here are what the demo's models were pretrained on (`pretrain_arms`, `pretrain_judge`) and what the demo
prompts them with (`DEMO_PROMPTS`). A rubric is one criterion in EVOLM's JSON schema: "The answer is N." (specific)
or "The answer is a number." (generic). The judge reads the rubric and the response, never the question, so it can
only match patterns; whatever correctness the rewards carry comes from the rubrics the model writes.

The verifier (`answer_reading`, `rubric_reading`) is for measurement only: training never calls it.
"""

from __future__ import annotations

import functools
import re

from datasets import Dataset

from ...evolm.diagnostics import EvalVerifier
from ...evolm.judges import SCORE_PREFIX
from ...evolm.prompts import Prompts
from ...evolm.rubrics import Criterion, Rubric, RubricError, RubricRules, parse_rubric
from ...tasks.arithmetic import Problem, extract_answer, problem

DEMO_PROMPTS = Prompts(
    policy="Question: {question}\nAnswer:",
    rubric_generation="Question: {question}\nRubric:",
    policy_with_rubric="Question: {question}\nRubric: {rubric}\nAnswer:",
    judge="Rubric: {rubric}\nResponse:{response}\n",  # no {question}: the judge cannot work the problem out itself
    infer_question="Answer:{response}\nQuestion:",
)
# One criterion is a complete rubric here ("The answer is N."); the format check is otherwise the authors'.
DEMO_RULES = RubricRules(min_criteria=1)

GENERIC_CRITERION = "The answer is a number."
_SPECIFIC = re.compile(r"^The answer is (-?\d+)\.$")
READINGS = ("correct", "misread", "slip")
RUBRIC_KINDS = ("correct", "misread", "other", "generic", "invalid")


def rubric_text(number: int | None) -> str:
    """The rubric stating that the answer is `number` (None: the generic rubric), as `Rubric.to_json` writes it."""
    text = GENERIC_CRITERION if number is None else f"The answer is {number}."
    return Rubric((Criterion(text, 1.0),)).to_json()


def stated_number(rubric: str) -> int | None:
    """The number a rubric states; None for a generic or an invalid rubric, or one in another form."""
    try:
        criteria = parse_rubric(rubric, DEMO_RULES).criteria
    except RubricError:
        return None
    match = _SPECIFIC.match(criteria[0].text) if len(criteria) == 1 else None
    return int(match.group(1)) if match else None


def judge_label(rubric: str, response: str) -> float:
    """The score the judge is trained to give: a specific rubric is met by a response whose first number is the one
    it states, the generic rubric by any response with a number. The question plays no part."""
    number = stated_number(rubric)
    first = extract_answer(response)
    if number is None:
        return float(first is not None and _is_generic(rubric))
    return float(first is not None and int(first) == number)


def judge_target(score: float) -> str:
    """The judge's reply for a 0/1 score, in the form `HFJudge` reads (`{"score": 1}` / `{"score": 0.0}`)."""
    return SCORE_PREFIX + ("1}" if score else "0.0}")


def question_dataset(split: str, size: int, offset: int = 0) -> Dataset:
    """The questions of `split`, and nothing else: EVOLM trains without reference answers."""
    return Dataset.from_dict({"question": [problem(split, offset + index).question for index in range(size)]})


# ----------------------------------------------------------------------------------------------------------------
# The verifier: measurement only.


def answer_reading(drawn: Problem, completion: str) -> str:
    """`"correct"`, `"misread"` (the other operation's result) or `"slip"` (neither, or no number)."""
    first = extract_answer(completion)
    if first is not None and int(first) == drawn.answer:
        return "correct"
    if first is not None and int(first) == drawn.misread_answer:
        return "misread"
    return "slip"


def rubric_reading(drawn: Problem, rubric: str) -> str:
    """What a rubric states about `drawn`: one of `RUBRIC_KINDS`."""
    number = stated_number(rubric)
    if number is not None:
        return "correct" if number == drawn.answer else "misread" if number == drawn.misread_answer else "other"
    return "generic" if _is_generic(rubric) else "invalid"


def eval_verifier(problems: list[Problem], held_out: list[Problem]) -> EvalVerifier:
    """The ground truth of `problems` (the questions a run trains on) and `held_out` (its probe) as an EVOLM run's
    evaluation-only verifier: every phase then logs answer and rubric accuracy, the net signal, the pair balance
    and the held-out accuracy."""
    by_question = {drawn.question: drawn for drawn in [*problems, *held_out]}
    return EvalVerifier(  # partials of module functions, not lambdas: a config holding them can be pickled
        answer_is_correct=functools.partial(_reads_correctly, answer_reading, by_question),
        rubric_is_correct=functools.partial(_reads_correctly, rubric_reading, by_question),
        held_out_questions=tuple(drawn.question for drawn in held_out),
    )


def _reads_correctly(reading, by_question: dict[str, Problem], question: str, text: str) -> bool:
    return reading(by_question[question], text) == "correct"


def _is_generic(rubric: str) -> bool:
    try:
        criteria = parse_rubric(rubric, DEMO_RULES).criteria
    except RubricError:
        return False
    return len(criteria) == 1 and criteria[0].text == GENERIC_CRITERION


def build_toy_tokenizer():
    """The tokenizer of the toy's models (digits one per token, no chat template): deterministic, under a second."""
    from ...tasks.arithmetic import MAX_OPERAND
    from ...testing import build_tiny_tokenizer

    questions = [problem("pretrain", index).question for index in range(1000)]
    numbers = range(4 * MAX_OPERAND + 1)
    corpus = [DEMO_PROMPTS.policy.format(question=question) for question in questions]
    rubric_prompts = [DEMO_PROMPTS.rubric_generation.format(question=question) for question in questions]
    corpus += [prompt + " " + rubric_text(n) for prompt, n in zip(rubric_prompts, numbers, strict=False)] * 4
    judge_prompts = [DEMO_PROMPTS.judge.format(rubric=rubric_text(n), response=f" {n}") for n in numbers]
    corpus += [prompt + judge_target(n % 2) for prompt, n in zip(judge_prompts, numbers, strict=True)]
    corpus += [DEMO_PROMPTS.infer_question.format(response=f" {n}") for n in numbers]
    corpus += [rubric_text(None)] * 20
    return build_tiny_tokenizer(vocab_size=640, chat_template=False, corpus=corpus, individual_digits=True)
