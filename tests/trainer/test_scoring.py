"""ESTrainer calls reward functions exactly as GRPOTrainer does."""

import logging
import math

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, TrainerState

from trl_es import ESTrainer


def test_reward_functions_receive_grpo_keyword_arguments(tiny_model_path, prompts, make_config):
    calls = []

    def spy(prompts, completions, completion_ids, answer, trainer_state, log_metric, **kwargs):
        calls.append((prompts, completions, completion_ids, answer, trainer_state))
        log_metric("spy/calls", 1.0)
        return [0.0] * len(prompts)

    trainer = ESTrainer(model=tiny_model_path, reward_funcs=spy, args=make_config(max_steps=1), train_dataset=prompts)
    trainer.train()
    assert len(calls) == 4  # one call per member
    batch_prompts, completions, completion_ids, answers, state = calls[0]
    assert len(batch_prompts) == len(completions) == len(completion_ids) == len(answers) == 4
    assert all(isinstance(c, str) for c in completions)
    assert all(isinstance(ids, list) and all(isinstance(t, int) for t in ids) for ids in completion_ids)
    assert [prompts["answer"][prompts["prompt"].index(p)] for p in batch_prompts] == answers  # columns stay aligned
    assert isinstance(state, TrainerState)
    assert trainer.state.log_history[0]["spy/calls"] == 1.0


def test_conversational_prompts_get_message_completions(tiny_model_path, conversational_prompts, make_config):
    seen = []

    def spy(prompts, completions, **kwargs):
        seen.extend(completions)
        return [0.0] * len(completions)

    ESTrainer(
        model=tiny_model_path, reward_funcs=spy, args=make_config(max_steps=1), train_dataset=conversational_prompts
    ).train()
    assert seen and all(c[0]["role"] == "assistant" and isinstance(c[0]["content"], str) for c in seen)


def test_several_functions_are_combined_with_reward_weights(tiny_model_path, prompts, make_config):
    def one(completions, **kwargs):
        return [1.0] * len(completions)

    def two(completions, **kwargs):
        return [2.0] * len(completions)

    config = make_config(max_steps=1, reward_weights=[0.5, 3.0])
    trainer = ESTrainer(model=tiny_model_path, reward_funcs=[one, two], args=config, train_dataset=prompts)
    trainer.train()
    logged = trainer.state.log_history[0]
    assert logged["reward"] == pytest.approx(0.5 * 1.0 + 3.0 * 2.0)
    assert logged["rewards/one/mean"] == 1.0 and logged["rewards/two/mean"] == 2.0


def test_async_reward_functions(tiny_model_path, prompts, make_config):
    async def async_reward(completions, **kwargs):
        return [float(len(c)) for c in completions]

    trainer = ESTrainer(
        model=tiny_model_path, reward_funcs=async_reward, args=make_config(max_steps=1), train_dataset=prompts
    )
    trainer.train()
    assert trainer.state.log_history[0]["rewards/async_reward/mean"] > 0


def test_none_means_no_score_and_is_skipped(tiny_model_path, prompts, make_config):
    def sometimes(completions, **kwargs):
        return [None if i % 2 else 1.0 for i in range(len(completions))]

    def always(completions, **kwargs):
        return [2.0] * len(completions)

    config = make_config(max_steps=1, reward_weights=[1.0, 1.0])
    trainer = ESTrainer(model=tiny_model_path, reward_funcs=[sometimes, always], args=config, train_dataset=prompts)
    trainer.train()
    logged = trainer.state.log_history[0]
    assert logged["rewards/sometimes/mean"] == 1.0  # NaN-aware mean over the scored completions
    assert logged["reward"] == pytest.approx((3.0 + 2.0) / 2)
    assert not math.isnan(logged["es/update_norm"])


def test_only_none_makes_no_update_warns_and_is_counted(tiny_model_path, prompts, make_config, caplog):
    # As GRPO, which warns and continues: a step that no function scored has no fitness, so ES moves nothing.
    def never(completions, **kwargs):
        return [None] * len(completions)

    config = make_config(sigma=0.1, learning_rate=0.1)
    trainer = ESTrainer(model=tiny_model_path, reward_funcs=never, args=config, train_dataset=prompts)
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    with caplog.at_level(logging.WARNING, logger="trl_es"):
        trainer.train()
    assert trainer.state.global_step == 2
    assert all(torch.equal(before[name], p) for name, p in trainer.model.named_parameters())
    logged = [entry for entry in trainer.state.log_history if "es/skipped_steps" in entry]
    assert [entry["es/skipped_steps"] for entry in logged] == [1.0, 2.0]
    assert sum("returned None for every completion" in r.message for r in caplog.records) == 2


def test_wrong_number_of_rewards_is_a_clear_error(tiny_model_path, prompts, make_config):
    def too_few(completions, **kwargs):
        return [1.0]

    trainer = ESTrainer(model=tiny_model_path, reward_funcs=too_few, args=make_config(), train_dataset=prompts)
    with pytest.raises(ValueError, match="returned 1 rewards, but 4 were expected"):
        trainer.train()


def test_reward_model_given_as_a_path(tmp_path, tiny_model_path, prompts, make_config):
    reward_model_path = tmp_path / "reward-model"
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_pretrained(tiny_model_path, num_labels=1).save_pretrained(
        reward_model_path
    )
    AutoTokenizer.from_pretrained(tiny_model_path).save_pretrained(reward_model_path)
    trainer = ESTrainer(
        model=tiny_model_path,
        reward_funcs=str(reward_model_path),
        args=make_config(max_steps=1),
        train_dataset=prompts,
    )
    trainer.train()
    logged = trainer.state.log_history[0]
    assert "rewards/reward-model/mean" in logged and logged["es/fitness/std"] > 0
