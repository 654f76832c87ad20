"""The texts the demo's two arms are pretrained on (`pretrain_arms`): answers misread by question template, joint
rubrics at random, null rubrics by the answers' rule, independently of the answer."""

import pytest

from trl_es.demo.evolm import pretrain_arms, toy
from trl_es.demo.evolm.pretrain_arms import ARM_KINDS, BASE_KINDS, HARD_TEMPLATES, arm_texts, pretraining_problem
from trl_es.tasks.arithmetic import TEMPLATES, problem, template_of


def readings(arm, kinds, count=8000):
    """Per drawn example: (hard template?, what the written answer reads, what the rubric reads), from the texts."""
    found = {"answer": [], "rubric": []}
    for index in range(count):
        drawn = pretraining_problem(index)
        if drawn.answer == drawn.misread_answer:  # a + 0: both readings agree, nothing to count
            continue
        prompt, completion = arm_texts(index, arm, kinds, seed=0)
        hard = template_of(drawn.question) in HARD_TEMPLATES
        if prompt.endswith("\nAnswer:") and "\nRubric: " not in prompt:  # not a rubric-conditioned answer
            found["answer"].append((hard, toy.answer_reading(drawn, completion)))
        elif prompt.endswith("\nRubric:"):
            found["rubric"].append((hard, toy.rubric_reading(drawn, completion)))
    return found


def misread_rate(pairs, hard):
    kinds = [kind for is_hard, kind in pairs if is_hard == hard]
    return kinds.count("misread") / len(kinds)


def test_every_question_has_the_template_that_wrote_it():
    assert len(TEMPLATES) == 6
    assert {template_of(problem("test", index).question) for index in range(200)} == set(range(6))
    with pytest.raises(ValueError, match="matches none of its templates"):
        template_of("How are you?")


def test_pretraining_asks_with_every_template_but_never_a_held_out_question():
    from trl_es.tasks.arithmetic import _held_out_questions

    questions = [pretraining_problem(index).question for index in range(3000)]
    counts = [sum(template_of(q) == template for q in questions) for template in range(6)]
    assert min(counts) > 300, counts  # the pretrain split alone never asks "What is a plus b?"
    assert not set(questions) & _held_out_questions()


@pytest.mark.parametrize("arm", ["joint", "null"])
def test_answers_misread_the_hard_templates_nine_times_in_ten_and_the_others_one_in_ten(arm):
    answers = readings(arm, ARM_KINDS)["answer"]
    assert misread_rate(answers, hard=True) == pytest.approx(pretrain_arms.HARD_MISREAD, abs=0.04)
    assert misread_rate(answers, hard=False) == pytest.approx(pretrain_arms.EASY_MISREAD, abs=0.04)


def test_joint_rubrics_misread_one_in_four_whatever_the_template_and_null_rubrics_as_the_answers():
    joint, null = readings("joint", ARM_KINDS)["rubric"], readings("null", ARM_KINDS)["rubric"]
    for hard in (True, False):
        assert misread_rate(joint, hard) == pytest.approx(pretrain_arms.JOINT_RUBRIC_MISREAD, abs=0.04)
    assert misread_rate(null, hard=True) == pytest.approx(pretrain_arms.HARD_MISREAD, abs=0.04)
    assert misread_rate(null, hard=False) == pytest.approx(pretrain_arms.EASY_MISREAD, abs=0.04)


def test_a_rubric_misreads_independently_of_the_answer_drawn_for_the_same_example():
    # Within one template class the answer's and the rubric's misreads are independent draws: their joint rate is
    # the product of their rates (read from the drawing rule, which both texts of an example share).
    both = answer = rubric = total = 0
    for index in range(20_000):
        drawn = pretraining_problem(index)
        if template_of(drawn.question) in HARD_TEMPLATES or drawn.answer == drawn.misread_answer:
            continue
        answer_misreads, rubric_misreads = pretrain_arms.misreads(index, "null", seed=0)
        both, answer, rubric, total = (
            both + (answer_misreads and rubric_misreads),
            answer + answer_misreads,
            rubric + rubric_misreads,
            total + 1,
        )
    assert both / total == pytest.approx((answer / total) * (rubric / total), abs=0.01)


def test_the_shared_base_writes_rubrics_by_either_arms_rule():
    rubrics = readings(None, BASE_KINDS)["rubric"]
    # Half joint (0.25), half null (0.9 on the hard templates): 0.575 on the hard templates, 0.175 elsewhere.
    assert misread_rate(rubrics, hard=True) == pytest.approx((0.25 + 0.9) / 2, abs=0.05)
    assert misread_rate(rubrics, hard=False) == pytest.approx((0.25 + 0.1) / 2, abs=0.05)
