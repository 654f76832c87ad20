"""Turns and what follows a tool call (`trl_es.agents.turns`), on the tiny tool-calling tokenizer."""

import pytest

from trl_es.agents.turns import ToolSuffix, parse_turn
from trl_es.testing import build_tool_tokenizer


def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def test_a_tool_call_turn_is_parsed_with_its_arguments_typed_by_the_tools_signature():
    tokenizer = build_tool_tokenizer()
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tools=[add],
                                           add_generation_prompt=True, return_dict=False)  # fmt: skip
    call = {"type": "function", "function": {"name": "add", "arguments": {"a": 3, "b": 4}}}
    user = [{"role": "user", "content": "hi"}]
    before = tokenizer.apply_chat_template(user, add_generation_prompt=True, return_dict=False)
    written = tokenizer.apply_chat_template([*user, {"role": "assistant", "content": "", "tool_calls": [call]}],
                                            return_dict=False)[len(before) :]  # fmt: skip
    assert parse_turn(tokenizer, written, prompt, [add])["tool_calls"] == [call]
    plain = tokenizer("It is 7.<|im_end|>", add_special_tokens=False)["input_ids"]
    assert parse_turn(tokenizer, plain, prompt) == {"role": "assistant", "content": "It is 7."}


def test_the_suffix_is_what_the_template_adds_for_the_results_after_the_end_of_turn():
    tokenizer = build_tool_tokenizer()
    call = {"type": "function", "function": {"name": "add", "arguments": {"a": 3, "b": 4}}}
    conversation = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    results = [{"role": "tool", "name": "add", "content": "7"}]
    without = tokenizer.apply_chat_template(conversation, return_dict=False)
    with_results = tokenizer.apply_chat_template(conversation + results, add_generation_prompt=True, return_dict=False)
    assert without + ToolSuffix(tokenizer)(results) == with_results


def test_a_template_that_rewrites_earlier_turns_is_refused_naming_the_fix():
    tokenizer = build_tool_tokenizer()
    tokenizer.chat_template = (  # renders the last message differently from the others: not prefix-preserving
        "{% for m in messages %}{% if loop.last %}<|im_start|>LAST {% endif %}{{ m.role }}{{ m.content }}"
        "<|im_end|>{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    with pytest.raises(ValueError, match="prefix-preserving chat template"):
        ToolSuffix(tokenizer)([{"role": "tool", "name": "add", "content": "7"}])
