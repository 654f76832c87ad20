"""Pretraining the embedded agent demo model (`trl_es.demo.pretrain_tools`): the careless solver's transcripts have the
stated habits, the loss falls on the assistant's turns only, and the same run gives the same weights bit for bit."""

import torch
from safetensors.torch import load_file

from trl_es.demo.pretrain_tools import (
    GUESS_RATE,
    WRONG_ITEM_RATE,
    pretrain_tools,
    tokenizer_corpus,
    tool_schemas,
    training_example,
    transcript,
)
from trl_es.tasks.lookup import question
from trl_es.testing import build_tool_tokenizer


def test_the_careless_solver_has_the_stated_habits():
    guesses, wrong_items, lookups = [[] for _ in GUESS_RATE], [], 0
    for index in range(4_000):
        asked, messages = question("pretrain", index), transcript(index)
        calls = [message["tool_calls"][0]["function"] for message in messages if message.get("tool_calls")]
        guesses[asked.template].append(calls[0]["name"] == "answer")
        if calls[0]["name"] == "lookup":
            lookups += 1
            assert calls[0]["arguments"]["item"] in (asked.item, asked.other)
            wrong_items.append(calls[0]["arguments"]["item"] == asked.other)
            assert str(calls[1]["arguments"]["value"]) == messages[2]["content"]  # it submits the price it read
        assert calls[-1]["name"] == "answer" and messages[-1] == {"role": "assistant", "content": ""}
    for rate, guessed in zip(GUESS_RATE, guesses, strict=True):
        assert abs(sum(guessed) / len(guessed) - rate) < 0.05
    assert abs(sum(wrong_items) / lookups - WRONG_ITEM_RATE) < 0.05


def test_the_loss_falls_on_the_assistant_turns_only():
    tokenizer = build_tool_tokenizer(vocab_size=512, corpus=tokenizer_corpus(200), individual_digits=True)
    index = next(i for i in range(100) if len(transcript(i)) == 6)  # one that looks the price up
    messages = transcript(index)
    ids, mask = training_example(tokenizer, messages, tool_schemas())
    looked_up, read = messages[1]["tool_calls"][0]["function"]["arguments"]["item"], messages[2]["content"]
    assert tokenizer.decode([token for token, learn in zip(ids, mask, strict=True) if learn]) == (
        f"<call>lookup item: {looked_up}</call><|im_end|><call>answer value: {read}</call><|im_end|><|im_end|>"
    )
    assert ids == tokenizer.apply_chat_template(messages, tools=tool_schemas(), tokenize=True, return_dict=False)


def test_tool_pretraining_is_deterministic(tmp_path):
    weights = []
    for run in ("a", "b"):
        model_dir = pretrain_tools(tmp_path / run, max_steps=3, batch_size=8, num_examples=64, log=lambda *args: None)
        weights.append(load_file(model_dir / "model.safetensors"))
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][name], weights[1][name]) for name in weights[0])
