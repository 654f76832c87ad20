"""The embedded arithmetic task (`trl_es.tasks.arithmetic`): problems, splits and the verifier. The script that
pretrains the demo model on it is tested in tests/demo/test_pretrain.py."""

import pytest

from trl_es.tasks.arithmetic import arithmetic_dataset, arithmetic_reward, extract_answer, problem


def test_problems_are_a_pure_function_of_split_and_index():
    assert problem("test", 7) == problem("test", 7)
    assert problem("test", 7) != problem("train", 7)


def test_pretraining_never_sees_a_held_out_question():
    held_out = {problem(split, i).question for split in ("train", "test") for i in range(10_000)}
    assert not held_out & {problem("pretrain", i).question for i in range(5_000)}


def test_answers_are_right_and_misread_answers_use_the_other_operation():
    for index in range(200):
        drawn = problem("test", index)
        a, b = (int(token) for token in drawn.question.replace("?", " ").replace(".", " ").split() if token.isdigit())
        if "minus" in drawn.question or "away" in drawn.question or "lost" in drawn.question:
            assert (drawn.answer, drawn.misread_answer) == (a - b, a + b)
        else:
            assert (drawn.answer, drawn.misread_answer) == (a + b, abs(a - b))


@pytest.mark.parametrize(
    "completion, expected", [(" 42", "42"), (" 7 apples", "7"), (" 007", "7"), (" none", None), ("", None)]
)
def test_the_verifier_reads_the_first_number(completion, expected):
    assert extract_answer(completion) == expected


def test_the_reward_is_one_only_for_the_right_first_number():
    rewards = arithmetic_reward([" 12", " 1 2", " twelve", [{"role": "assistant", "content": "12"}]], ["12"] * 4)
    assert rewards == [1.0, 0.0, 0.0, 1.0]


def test_dataset_has_prompts_and_answers_and_refuses_too_many_held_out_problems():
    dataset = arithmetic_dataset("test", 3)
    assert dataset[0]["prompt"].startswith("Question: ") and dataset[0]["prompt"].endswith("\nAnswer:")
    assert dataset[0]["answer"] == str(problem("test", 0).answer)
    with pytest.raises(ValueError, match="size=20000"):
        arithmetic_dataset("test", 20_000)
    with pytest.raises(ValueError, match="'validation'"):
        problem("validation", 0)
