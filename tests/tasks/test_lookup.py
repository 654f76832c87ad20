"""The offline agent task (`trl_es.tasks.lookup`): questions and splits, the dataset, and the environment in TRL's
contract (tools, reset, reward, seeding). The script that pretrains the agent demo model on it is tested in
tests/demo/test_pretrain_tools.py."""

import inspect
import os
import random

import pytest
from transformers.utils import get_json_schema

from trl_es.tasks.lookup import ITEMS, SPLITS, LookupEnvironment, lookup_dataset, question, split_of


def test_questions_are_a_pure_function_of_split_and_index():
    assert question("test", 7) == question("test", 7)
    assert question("test", 7) != question("train", 7)


def test_splits_never_share_a_question():
    questions = {split: {question(split, index).text for index in range(3_000)} for split in SPLITS}
    assert not questions["pretrain"] & questions["train"]
    assert not questions["pretrain"] & questions["test"]
    assert not questions["train"] & questions["test"]
    assert all(split_of(text) == split for split, texts in questions.items() for text in texts)


def test_a_question_names_two_items_and_asks_for_one_of_them():
    for index in range(200):
        drawn = question("test", index)
        named = [word.strip("?.,") for word in drawn.text.split() if word.strip("?.,") in ITEMS]
        assert drawn.item != drawn.other and set(named) == {drawn.item, drawn.other}
        assert named[-1] == drawn.item  # the last item named is the one asked for


def test_an_unknown_split_is_refused():
    with pytest.raises(ValueError, match="'validation'"):
        question("validation", 0)


def test_dataset_has_conversational_prompts_and_the_asked_item():
    dataset = lookup_dataset("test", 3, offset=5)
    assert dataset.column_names == ["prompt", "item"]
    assert dataset[0]["prompt"] == [{"role": "user", "content": question("test", 5).text}]
    assert dataset[0]["item"] == question("test", 5).item


def test_the_environment_follows_trls_contract():
    environment = LookupEnvironment()  # built without arguments
    methods = {name for name, _ in inspect.getmembers(LookupEnvironment, predicate=inspect.isfunction)}
    assert {name for name in methods if not name.startswith("_")} - {"reset", "get_reward"} == {"lookup", "answer"}
    # tools: type hints and Google docstrings, from which transformers writes their schemas
    assert get_json_schema(environment.lookup)["function"]["parameters"]["properties"] == {
        "item": {"type": "string", "description": "The name of the item."}
    }
    assert get_json_schema(environment.answer)["function"]["parameters"]["properties"]["value"]["type"] == "integer"
    row = lookup_dataset("train", 1)[0]
    assert environment.reset(**row) is None  # every column of the row, the prompt among them; the prompt stays as is
    assert isinstance(environment.get_reward(), float)


def test_the_reward_is_one_only_for_the_asked_items_price():
    environment = LookupEnvironment()
    environment.reset(item="lamp")
    assert environment.get_reward() == 0.0  # nothing submitted
    assert environment.answer(environment.lookup("lamp")) == "ok"
    assert environment.get_reward() == 1.0
    environment.reset(item="lamp")
    other = environment.lookup("desk")
    environment.answer(other)
    assert environment.get_reward() == float(other == environment.lookup("lamp"))


def test_only_the_first_answer_counts():
    environment = LookupEnvironment()
    environment.reset(item="lamp")
    environment.answer(str(environment.lookup("lamp") % 99 + 1))  # wrong, and given as text: still a number
    with pytest.raises(ValueError, match="Already answered"):
        environment.answer(environment.lookup("lamp"))
    assert environment.get_reward() == 0.0


def test_bad_tool_arguments_and_an_unknown_item_raise():
    environment = LookupEnvironment()
    environment.reset(item="lamp")
    with pytest.raises(ValueError, match="No item named 'table'"):
        environment.lookup("table")
    with pytest.raises(ValueError):
        environment.answer("twelve")
    with pytest.raises(ValueError, match="item='table'"):
        environment.reset(item="table")


def test_the_same_global_seed_gives_the_same_episode():
    first, second = LookupEnvironment(), LookupEnvironment()
    random.seed(1234)
    first.reset(item="lamp")
    random.seed(1234)
    second.reset(item="lamp")
    assert first.prices == second.prices
    random.seed(4321)
    second.reset(item="lamp")
    assert first.prices != second.prices  # the prices come from Python's global `random`, not from the row


def test_grpo_trainer_takes_the_environment_and_the_tool_tokenizer(tmp_path, monkeypatch):
    # TRL's checks at construction: the template supports tool calling (else ValueError), is prefix-preserving (else a
    # training template TRL only knows for its own), and has a response template (else `add_response_schema`, which
    # fails for templates TRL does not know); the environment's reward becomes a reward function.
    monkeypatch.setitem(os.environ, "TRL_EXPERIMENTAL_SILENCE", "1")
    from trl import GRPOConfig, GRPOTrainer

    from trl_es.testing import build_tiny_qwen2, build_tool_tokenizer

    tokenizer = build_tool_tokenizer()
    args = GRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=2, use_cpu=True, bf16=False
    )
    trainer = GRPOTrainer(
        model=build_tiny_qwen2(tokenizer),
        args=args,
        processing_class=tokenizer,
        train_dataset=lookup_dataset("train", 8),
        environment_factory=LookupEnvironment,
    )
    assert trainer.reward_func_names == ["LookupEnvironment"]
    assert sorted(tool.__name__ for tool in trainer.tools) == ["answer", "lookup"]
    assert trainer.chat_template is None  # the tokenizer's own template serves for training
