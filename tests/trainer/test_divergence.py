"""Divergence is caught, never saved (`trl_es.trainer.divergence`, issue 16, points 1 and 4): a non-finite update
stops training naming the step, the cause and the last good checkpoint; no NaN reaches a checkpoint; and steps without
an update direction are counted and warned about. The guards themselves are tested in tests/core/test_guards.py."""

import logging
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from scripts.fast_es import MOVING

from trl_es import ESTrainer
from trl_es.core.guards import NonFiniteError
from trl_es.testing import digit_fraction


@pytest.mark.parametrize("shaping", ["none", "zscore"])  # z-score (the default) would turn it into NaN fitness
def test_an_infinite_reward_stops_training_naming_step_function_sample_and_last_good_checkpoint(
    tiny_model_path, prompts, make_config, shaping
):
    def sometimes_infinite(completions, trainer_state, **kwargs):
        rewards = digit_fraction(completions)
        if trainer_state.global_step == 1:  # in step 2
            rewards[1] = float("inf")
        return rewards

    config = make_config(**MOVING, fitness_shaping=shaping, max_steps=3, save_strategy="steps", save_steps=1)
    trainer = ESTrainer(model=tiny_model_path, reward_funcs=sometimes_infinite, args=config, train_dataset=prompts)
    with pytest.raises(NonFiniteError) as stopped:
        trainer.train()
    message = str(stopped.value)
    assert "ES step 2 stopped training: the reward function 'sometimes_infinite' returned inf" in message
    assert "answer to prompt 1 (" in message and "checkpoint-1" in message
    output = Path(config.output_dir)
    assert not (output / "checkpoint-2").exists()
    last_good = load_file(output / "checkpoint-1" / "model.safetensors")
    for name, param in trainer.model.named_parameters():  # the failed step applied nothing
        assert torch.equal(param.detach(), last_good[name]), name


def test_weights_holding_nan_are_neither_trained_nor_saved(tiny_model_path, prompts, make_config, tmp_path):
    trainer = ESTrainer(model=tiny_model_path, reward_funcs=digit_fraction, args=make_config(), train_dataset=prompts)
    with torch.no_grad():
        trainer.model.model.norm.weight[0] = float("nan")
    with pytest.raises(NonFiniteError, match=r"weights to be saved to .*final hold non-finite values: 'model.norm"):
        trainer.save_model(str(tmp_path / "final"))
    assert not (tmp_path / "final").exists()
    with pytest.raises(NonFiniteError, match="The model's evolving weights hold non-finite values: 'model.norm"):
        trainer.train()


def test_a_float16_model_whose_update_overflows_stops_at_that_step_naming_the_tensor(tiny_model_path, prompts,
                                                                                   make_config):  # fmt: skip
    """Issue 27: at a huge learning rate a float16 model's weights went infinite while its float32 master stayed
    finite, and it trained three more steps (reward 0) before saving refused them."""
    config = make_config(**{**MOVING, "learning_rate": 1e5}, max_steps=4, model_init_kwargs={"dtype": "float16"})
    trainer = ESTrainer(model=tiny_model_path, reward_funcs=digit_fraction, args=config, train_dataset=prompts)
    with pytest.raises(NonFiniteError, match=r"ES step 1 stopped training: the update of '[\w.]+' would make it "
                       r"non-finite .* the parameter's float16 holds up to 6.55e\+04"):  # fmt: skip
        trainer.train()
    assert trainer.state.global_step == 0  # no further step ran
    assert all(torch.isfinite(param).all() for param in trainer.model.parameters())


def test_steps_without_an_update_direction_are_counted_and_warned_about(tiny_model_path, prompts, make_config, caplog):
    def constant(completions, **kwargs):
        return [1.0] * len(completions)

    trainer = ESTrainer(model=tiny_model_path, reward_funcs=constant, args=make_config(), train_dataset=prompts)
    trainer.warn_after_degenerate_steps = 2
    with caplog.at_level(logging.WARNING, logger="trl_es"):
        trainer.train()
    logged = [entry["es/degenerate_steps"] for entry in trainer.state.log_history if "es/degenerate_steps" in entry]
    assert logged == [1.0, 2.0]
    warned = [r.message for r in caplog.records if "had no update direction" in r.message]
    assert len(warned) == 1 and "The last 2 ES steps" in warned[0] and "all members scored 1" in warned[0]


def test_a_step_with_a_direction_ends_the_run_of_steps_without_one(tiny_model_path, prompts, make_config, caplog):
    def flat_but_in_step_two(completions, trainer_state, **kwargs):
        return digit_fraction(completions) if trainer_state.global_step == 1 else [1.0] * len(completions)

    config = make_config(**MOVING, max_steps=3)
    trainer = ESTrainer(model=tiny_model_path, reward_funcs=flat_but_in_step_two, args=config, train_dataset=prompts)
    trainer.warn_after_degenerate_steps = 2
    with caplog.at_level(logging.WARNING, logger="trl_es"):
        trainer.train()
    logged = [entry["es/degenerate_steps"] for entry in trainer.state.log_history if "es/degenerate_steps" in entry]
    assert logged == [1.0, 1.0, 2.0]  # two flat steps in all, never two in a row
    assert not [r for r in caplog.records if "had no update direction" in r.message]
