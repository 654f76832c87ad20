"""What each EVOLM phase logs about both roles: rubric validity and rubric-answer agreement always, and with an
evaluation-only verifier, accuracy, the per-question net signal, the pair balance and held-out accuracy."""

import json

import pytest

from trl_es.evolm.diagnostics import EvalVerifier, held_out_accuracy, pair_balance, phase_diagnostics
from trl_es.evolm.pairs import Pair
from trl_es.evolm.rubrics import RubricRules

RULES = RubricRules(min_criteria=1)


def rubric(number) -> str:
    return json.dumps({"criteria": [{"criterion": f"The answer is {number}.", "weight": 1.0}]})


class MatchJudge:
    """1 when the response is the number the rubric states, else 0."""

    async def score(self, question, rubric_text, response):
        return float(f"The answer is {response}." in rubric_text)


# Questions "k" whose right answer is k; the model answers and writes rubrics of its own.
VERIFIER = EvalVerifier(
    answer_is_correct=lambda question, answer: answer == question,
    rubric_is_correct=lambda question, text: text == rubric(question),
    held_out_questions=("7", "8"),
)


def test_diagnostics_without_a_verifier_measure_validity_and_agreement_only():
    questions, answers = ["1", "2", "3", "4"], ["1", "5", "3", "9"]
    rubrics = [rubric(1), rubric(2), "not a rubric", rubric(9)]
    found = phase_diagnostics(questions, answers, rubrics, MatchJudge(), RULES)
    # Valid: 3 of 4; the judge agrees with the answer under its own rubric on questions 1 and 4 of those 3.
    assert found == {"rubric_valid_rate": 0.75, "rubric_answer_agreement": pytest.approx(2 / 3)}


def test_the_net_signal_counts_questions_where_the_rubric_knows_better_than_the_answer():
    questions = ["1", "2", "3", "4", "5"]
    answers = ["9", "9", "3", "4", "9"]  # right on 3 and 4
    rubrics = [rubric(1), rubric(2), rubric(9), rubric(4), rubric(8)]  # right on 1, 2 and 4
    found = phase_diagnostics(questions, answers, rubrics, MatchJudge(), RULES, VERIFIER)
    # Rubric right and answer wrong: 1, 2; answer right and rubric wrong: 3. Net: (2 - 1) / 5.
    assert found["net_signal"] == pytest.approx(0.2)
    assert found["answer_accuracy"] == pytest.approx(0.4) and found["rubric_accuracy"] == pytest.approx(0.6)
    assert "held_out_accuracy" not in found and "pair_balance" not in found


def test_the_pair_balance_says_whether_a_source_prefers_right_answers():
    pairs = [
        Pair("1", "1", "9", "temporal"),
        Pair("2", "9", "2", "temporal"),
        Pair("3", "8", "9", "temporal"),
        Pair("4", "4", "7", "inferred"),
    ]
    assert pair_balance(pairs, VERIFIER) == {
        "temporal": {"right_over_wrong": 1, "wrong_over_right": 1, "neither": 1},
        "inferred": {"right_over_wrong": 1, "wrong_over_right": 0, "neither": 0},
    }


def test_held_out_accuracy_answers_the_verifiers_held_out_questions():
    asked = []

    def answer_greedily(questions):
        asked.extend(questions)
        return ["7", "0"]

    assert held_out_accuracy(answer_greedily, VERIFIER) == 0.5 and asked == ["7", "8"]
    found = phase_diagnostics(["1"], ["1"], [rubric(1)], MatchJudge(), RULES, VERIFIER, [], answer_greedily)
    assert found["held_out_accuracy"] == 0.5 and found["pair_balance"] == {}
