"""The locally built fixtures of `trl_es.testing`: the compact tool-calling chat template and the tokenizer it equips,
checked with the helpers TRL's GRPOTrainer relies on for tools and environments."""

import pytest
from transformers import AutoTokenizer
from trl.chat_template_utils import is_chat_template_prefix_preserving, parse_response, supports_tool_calling

from trl_es.testing import build_tiny_qwen2, build_tiny_tokenizer, build_tool_tokenizer, equip_for_tools


def multiply(a: int, b: int) -> int:
    """Multiply two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a * b


def greet(name: str) -> str:
    """Greet someone.

    Args:
        name: Who to greet.
    """
    return f"hello {name}"


QUESTION = [{"role": "user", "content": "What is 3 times 4?"}]
CALL = {
    "role": "assistant",
    "content": "",
    "tool_calls": [{"type": "function", "function": {"name": "multiply", "arguments": {"a": 3, "b": 4}}}],
}


def render(tokenizer, messages, add_generation_prompt=False, tools=(multiply, greet)):
    return tokenizer.apply_chat_template(
        messages,
        tools=list(tools) or None,
        add_generation_prompt=add_generation_prompt,
        tokenize=True,
        return_dict=False,
    )


@pytest.fixture(scope="module")
def tool_tokenizer():
    return build_tool_tokenizer()


def test_tool_template_supports_tool_calling_and_is_prefix_preserving(tool_tokenizer):
    # GRPOTrainer refuses tools without the first; without the second it needs a training template it only knows for
    # the templates it ships.
    assert supports_tool_calling(tool_tokenizer)
    assert is_chat_template_prefix_preserving(tool_tokenizer)


def test_tool_template_lists_tools_by_name_and_parameters(tool_tokenizer):
    text = tool_tokenizer.apply_chat_template(QUESTION, tools=[multiply, greet], tokenize=False)
    assert text.startswith("<|im_start|>system\ntools: multiply(a,b), greet(name)<|im_end|><|im_start|>user\n")
    # without tools there is no tools line
    assert tool_tokenizer.apply_chat_template(QUESTION, tokenize=False).startswith("<|im_start|>user\n")


def test_tool_template_writes_calls_and_results_compactly(tool_tokenizer):
    result = {"role": "tool", "name": "multiply", "content": "12"}
    text = tool_tokenizer.apply_chat_template(QUESTION + [CALL, result], add_generation_prompt=True, tokenize=False)
    assert text.endswith(
        "<|im_start|>assistant\n<call>multiply a: 3 b: 4</call><|im_end|>"
        "<|im_start|>tool\n12<|im_end|><|im_start|>assistant\n"
    )


def test_every_turn_ends_with_the_eos_token(tool_tokenizer):
    assert tool_tokenizer.eos_token == "<|im_end|>" and tool_tokenizer.pad_token == "<|endoftext|>"
    assert render(tool_tokenizer, QUESTION + [CALL])[-1] == tool_tokenizer.eos_token_id
    model = build_tiny_qwen2(tool_tokenizer)
    assert model.generation_config.eos_token_id == tool_tokenizer.eos_token_id


def test_parse_response_reads_a_tool_call_turn_back(tool_tokenizer):
    prompt = render(tool_tokenizer, QUESTION, add_generation_prompt=True)
    turn = render(tool_tokenizer, QUESTION + [CALL])[len(prompt) :]
    assert parse_response(tool_tokenizer, turn, prefix=prompt, tools=[multiply, greet]) == CALL


def test_parse_response_reads_a_plain_answer_turn_back(tool_tokenizer):
    prompt = render(tool_tokenizer, QUESTION, add_generation_prompt=True)
    answer = {"role": "assistant", "content": "It is 12."}
    turn = render(tool_tokenizer, QUESTION + [answer])[len(prompt) :]
    assert parse_response(tool_tokenizer, turn, prefix=prompt) == answer


def test_parse_response_types_arguments_by_the_tool_signature(tool_tokenizer):
    prompt = render(tool_tokenizer, QUESTION, add_generation_prompt=True)
    turn = tool_tokenizer("<call>greet name: 42</call><call>multiply a: 6 b: 7</call><|im_end|>")["input_ids"]
    calls = parse_response(tool_tokenizer, turn, prefix=prompt, tools=[multiply, greet])["tool_calls"]
    assert [call["function"]["arguments"] for call in calls] == [{"name": "42"}, {"a": 6, "b": 7}]
    untyped = parse_response(tool_tokenizer, turn, prefix=prompt)["tool_calls"]  # without the tools: text
    assert [call["function"]["arguments"] for call in untyped] == [{"name": "42"}, {"a": "6", "b": "7"}]


def test_an_unclosed_call_ends_with_the_turn(tool_tokenizer):
    prompt = render(tool_tokenizer, QUESTION, add_generation_prompt=True)
    for text in ("<call>multiply a: 3 b: 4<|im_end|>", "<call>multiply a: 3 b: 4"):  # ended, and cut by the length
        ids = tool_tokenizer(text)["input_ids"]
        assert parse_response(tool_tokenizer, ids, prefix=prompt, tools=[multiply, greet]) == CALL


def test_tool_results_continue_the_generated_ids_as_the_template_renders_them(tool_tokenizer):
    # TRL's tool loop appends the template's rendering of the tool results (from the assistant's EOS on) to the ids
    # it generated, without re-tokenizing; that must be the rendering of the whole conversation.
    results = [
        {"role": "tool", "name": "multiply", "content": "12"},
        {"role": "tool", "name": "greet", "content": "x"},
    ]
    dummy = [{"role": "user", "content": "dummy"}, {**CALL, "tool_calls": [_call("multiply", {})]}]
    suffix = render(tool_tokenizer, dummy + results, add_generation_prompt=True)[len(render(tool_tokenizer, dummy)) :]
    generated = render(tool_tokenizer, QUESTION + [CALL])
    assert generated + suffix == render(tool_tokenizer, QUESTION + [CALL] + results, add_generation_prompt=True)


def test_the_tool_template_survives_saving_and_loading(tool_tokenizer, tmp_path):
    tool_tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert (loaded.eos_token, loaded.pad_token) == ("<|im_end|>", "<|endoftext|>")
    prompt = render(loaded, QUESTION, add_generation_prompt=True)
    turn = render(loaded, QUESTION + [CALL])[len(prompt) :]
    assert parse_response(loaded, turn, prefix=prompt, tools=[multiply, greet]) == CALL


def test_equipping_a_tiny_tokenizer_adds_the_call_tokens_and_keeps_the_rest():
    tokenizer = build_tiny_tokenizer()
    vocabulary = tokenizer.get_vocab()
    equip_for_tools(tokenizer)
    assert tokenizer.convert_ids_to_tokens(render(tokenizer, QUESTION + [CALL])).count("<call>") == 1
    assert len(tokenizer) == len(vocabulary) + 2
    assert all(tokenizer.get_vocab()[token] == index for token, index in vocabulary.items())


def _call(name, arguments):
    return {"type": "function", "function": {"name": name, "arguments": arguments}}
