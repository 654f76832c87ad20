"""The multi-turn tool loop (`trl_es.agents.tool_loop`), driven by a scripted `generate`: GRPO's semantics (tools run,
results appended as the template renders them, the budget, the rounds), for many rollouts at once."""

import pytest

from trl_es.agents.tool_loop import ToolLoop, ToolRollout
from trl_es.agents.turns import ToolSuffix, parse_turn
from trl_es.testing import build_tool_tokenizer


def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


@pytest.fixture(scope="module")
def tokenizer():
    return build_tool_tokenizer()


def ids(tokenizer, content: str = "", **calls) -> list[int]:
    """The ids of an assistant turn saying `content` and making `calls` (`name={arguments}`), as the chat template
    writes it (whatever its call syntax), ending with the end-of-turn token."""
    tool_calls = [{"type": "function", "function": {"name": name, "arguments": arguments}}
                  for name, arguments in calls.items()]  # fmt: skip
    message = {"role": "assistant", "content": content, "tool_calls": tool_calls}
    user = [{"role": "user", "content": "hi"}]
    before = tokenizer.apply_chat_template(user, add_generation_prompt=True, return_dict=False)
    rendered = tokenizer.apply_chat_template([*user, message], return_dict=False)
    assert rendered[: len(before)] == before  # the template is prefix-preserving: the turn follows the header
    return rendered[len(before) :]


def rollout(tokenizer, first_turn: list[int], tools=(add,)) -> ToolRollout:
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "3 plus 4?"}], tools=list(tools), add_generation_prompt=True, return_dict=False
    )
    turn = list(first_turn)
    message = parse_turn(tokenizer, turn, prompt, list(tools))
    return ToolRollout(list(prompt), turn, [message], {tool.__name__: tool for tool in tools}, list(tools))


def loop(tokenizer, **settings) -> ToolLoop:
    return ToolLoop(tokenizer, ToolSuffix(tokenizer), **{"max_completion_length": 200, **settings})


def scripted(tokenizer, *turns: str):
    """A `generate` that answers round r with `turns[r - 1]` for every rollout it is asked for, and records calls."""
    calls = []

    def generate(indices, contexts, round_number):
        calls.append((list(indices), round_number, [list(context) for context in contexts]))
        return [list(turns[round_number - 1]) for _ in indices]

    return generate, calls


def test_a_tool_call_is_run_and_the_next_turn_continues_after_its_result(tokenizer):
    calling = rollout(tokenizer, ids(tokenizer, add={"a": 3, "b": 4}))
    answering = rollout(tokenizer, ids(tokenizer, "7"))
    first_ids = list(calling.completion_ids)
    generate, calls = scripted(tokenizer, ids(tokenizer, "It is 7."))
    counts = loop(tokenizer).run([calling, answering], generate)

    assert (counts.calls, counts.failures) == (1, 0)
    assert [call[:2] for call in calls] == [([0], 1)]  # only the rollout with a pending call, round 1
    tool_message = {"role": "tool", "name": "add", "content": "7"}
    assert calling.messages[1] == tool_message and calling.messages[2]["content"] == "It is 7."
    suffix = ToolSuffix(tokenizer)([tool_message])
    expected_context = calling.prompt_ids + first_ids + suffix
    assert calls[0][2] == [expected_context]  # the template's rendering of the result, after the model's own ids
    second = ids(tokenizer, "It is 7.")
    assert calling.completion_ids == first_ids + suffix + second
    assert calling.tool_mask == [1] * len(first_ids) + [0] * len(suffix) + [1] * len(second)
    assert len(answering.messages) == 1 and answering.tool_mask == [1] * len(answering.completion_ids)


def test_a_failed_or_unknown_tool_is_counted_and_its_error_is_what_the_model_reads(tokenizer):
    wrong_argument = rollout(tokenizer, ids(tokenizer, add={"a": 3, "c": 4}))
    unknown = rollout(tokenizer, ids(tokenizer, subtract={"a": 3, "b": 4}))
    generate, _ = scripted(tokenizer, ids(tokenizer, "Sorry."))
    counts = loop(tokenizer).run([wrong_argument, unknown], generate)
    assert (counts.calls, counts.failures) == (2, 2)
    assert "unexpected keyword argument 'c'" in wrong_argument.messages[1]["content"]
    assert unknown.messages[1]["content"] == "{'error': 'Tool subtract not found.'}"


def test_rounds_stop_at_max_iterations_leaving_the_last_call_unanswered(tokenizer):
    calling = rollout(tokenizer, ids(tokenizer, add={"a": 1, "b": 1}))
    generate, calls = scripted(tokenizer, ids(tokenizer, add={"a": 2, "b": 2}), ids(tokenizer, add={"a": 3, "b": 3}))
    counts = loop(tokenizer, max_iterations=2).run([calling], generate)
    assert [call[1] for call in calls] == [1, 2] and counts.calls == 2
    assert calling.pending_calls  # the third call was generated, not run
    assert [m["role"] for m in calling.messages] == ["assistant", "tool", "assistant", "tool", "assistant"]


def test_results_past_the_budget_end_the_rollout_at_its_call_which_still_counts(tokenizer):
    calling = rollout(tokenizer, ids(tokenizer, add={"a": 3, "b": 4}))
    before = (list(calling.completion_ids), list(calling.messages))
    generate, calls = scripted(tokenizer, ids(tokenizer, "7"))
    counts = loop(tokenizer, max_completion_length=len(calling.completion_ids) + 2).run([calling], generate)
    assert counts.calls == 1 and calls == []  # the tool ran; its result did not fit, so nothing was generated
    assert (calling.completion_ids, calling.messages) == before


def test_a_turn_is_cut_to_what_the_budget_leaves(tokenizer):
    calling = rollout(tokenizer, ids(tokenizer, add={"a": 3, "b": 4}))
    suffix = ToolSuffix(tokenizer)([{"role": "tool", "name": "add", "content": "7"}])
    budget = len(calling.completion_ids) + len(suffix) + 3
    generate, _ = scripted(tokenizer, ids(tokenizer, "The answer is seven."))
    loop(tokenizer, max_completion_length=budget).run([calling], generate)
    assert len(calling.completion_ids) == budget and sum(calling.tool_mask) == budget - len(suffix)


def test_the_context_length_ends_a_rollout_like_the_budget(tokenizer):
    calling = rollout(tokenizer, ids(tokenizer, add={"a": 3, "b": 4}))
    generate, calls = scripted(tokenizer, ids(tokenizer, "7"))
    loop(tokenizer, context_length=len(calling.prompt_ids) + len(calling.completion_ids) + 1).run([calling], generate)
    assert calls == [] and len(calling.messages) == 1
