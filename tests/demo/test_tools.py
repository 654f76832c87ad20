"""The offline agent demo (`trl_es.demo.tools`, `trl-es demo --task tools`): the embedded tool-calling model, its
held-out episodes measured through `ESTrainer.evaluate`, and the demo run at a tiny size (the full run's numbers over
three seeds are docs/tools_demo.md, from `python -m experiments.tools_demo`)."""

from dataclasses import replace

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from trl_es.demo.tools import (
    TOOLS_DEMO,
    TOOLS_MODEL,
    format_episodes,
    held_out_episodes,
    run_tools_demo,
    tools_trainer,
)
from trl_es.testing import TOOL_CHAT_TEMPLATE, TOOL_RESPONSE_TEMPLATE

SMALL = replace(TOOLS_DEMO, max_steps=2, population_size=4, prompts_per_step=8, num_train=64, num_held_out=32)


def test_the_embedded_tools_model_carries_the_tool_template():
    model, tokenizer = AutoModelForCausalLM.from_pretrained(TOOLS_MODEL), AutoTokenizer.from_pretrained(TOOLS_MODEL)
    assert tokenizer.chat_template == TOOL_CHAT_TEMPLATE and tokenizer.response_template == TOOL_RESPONSE_TEMPLATE
    end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id == end_of_turn
    assert sum(parameter.numel() for parameter in model.parameters()) < 1_000_000


def test_the_embedded_model_calls_the_tools_and_fails_some_held_out_episodes(tmp_path):
    before = held_out_episodes(tools_trainer(SMALL, str(tmp_path)))
    assert 0.2 <= before["success"] <= 0.8  # room for ES either way
    assert 1.0 < before["tool calls"] < 2.0  # it answers some questions without looking anything up
    assert before["failed calls"] < 0.05  # its calls are well formed
    assert before["turns"] == pytest.approx(before["tool calls"] + 1)  # one turn per call, and the closing one


def test_the_demo_trains_and_measures_the_same_questions_before_and_after(tmp_path):
    lines = []
    result = run_tools_demo(str(tmp_path), max_steps=2, num_held_out=32, settings=SMALL, log=lines.append)
    assert (tmp_path / "model.safetensors").is_file()
    assert result.before == held_out_episodes(tools_trainer(SMALL, str(tmp_path / "again")))  # greedy: reproducible
    assert set(result.after) == set(result.before) == {"success", "tool calls", "failed calls", "turns"}
    assert format_episodes(result.before, result.after, 32) in lines
