"""A user's rollout function under ES (`trl_es.agents.rollout_functions`): GRPO's signature and ES's, checked output,
extra fields merged into the rows as GRPO merges them."""

import pytest

from trl_es.agents.rollout_functions import (
    MemberHandle,
    call_rollout_func,
    extra_fields,
    rows_with_fields,
    takes_member,
)


def handle(generated: list) -> MemberHandle:
    return MemberHandle(3, 11, 1, 100, lambda ids, seeds: generated.append((ids, seeds)) or [[9]] * len(ids))


def test_es_rollout_functions_take_a_member_and_grpo_ones_do_not():
    def grpo(prompts, trainer):
        return {}

    def es(prompts, trainer, member):
        return {}

    assert takes_member(es) and not takes_member(grpo)


def test_a_member_generates_row_j_with_seed_sampling_seed_plus_j_unless_told_otherwise():
    generated = []
    member = handle(generated)
    assert member.generate([[1], [2]]) == [[9], [9]]
    member.generate([[1]], seeds=[5])
    assert generated == [([[1], [2]], [100, 101]), ([[1]], [5])]


def test_the_output_is_checked_and_its_extra_fields_reach_the_rows():
    def rollout(prompts, trainer, member):
        return {"prompt_ids": [[1]] * 2, "completion_ids": [[2]] * 2, "logprobs": None, "score": [0.5, 1.0],
                "tag": "x", "env_mask": [[1]] * 2}  # fmt: skip

    output = call_rollout_func(rollout, ["a", "b"], None, handle([]))
    assert extra_fields(output) == {"score": [0.5, 1.0], "tag": "x"}
    rows = rows_with_fields([{"prompt": "a"}, {"prompt": "b"}], extra_fields(output))
    assert rows == [{"prompt": "a", "score": 0.5, "tag": "x"}, {"prompt": "b", "score": 1.0, "tag": "x"}]
    with pytest.raises(ValueError, match=r"must return keys \['logprobs'\]"):
        call_rollout_func(lambda prompts, trainer: {"prompt_ids": [], "completion_ids": []}, [], None, handle([]))
    with pytest.raises(ValueError, match="returned 1 completion_ids for 2 prompts"):
        call_rollout_func(
            lambda p, t: {"prompt_ids": [[1]] * 2, "completion_ids": [[1]], "logprobs": None}, ["a", "b"], None, None
        )
