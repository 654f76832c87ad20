"""What a reward function returns, checked where it returns it (`trl_es.trainer.reward_checks`, issue 16, point 6): a
wrong type is an error naming the function and the value, every list TRL accepts passes, all-NaN rewards are reported
as NaN and not as None, and a reward function's own error propagates."""

import logging

import numpy as np
import pytest
import torch

from trl_es import ESTrainer
from trl_es.trainer.reward_checks import check_reward_output


@pytest.mark.parametrize(
    ("output", "message"),
    [
        ("1.0", r"returned '1.0' \(a str\), but a reward function returns a list"),
        (1.0, r"returned 1.0 \(a float\)"),
        (None, r"returned None \(a NoneType\)"),
        ([1.0, "yes"], r"returned 'yes' \(a str\) for completion 1; each reward must be a number, or None"),
        ([1.0, [2.0, 3.0]], r"returned \[2.0, 3.0\] \(a list\) for completion 1"),
    ],
)
def test_a_reward_of_the_wrong_type_is_named(output, message):
    with pytest.raises(TypeError, match=message):
        check_reward_output("my_reward", output)


def test_a_reward_too_large_for_a_float_is_named_with_the_fix():
    """Issue 27: `10**400` gave a bare OverflowError from deep inside the conversion."""
    with pytest.raises(
        ValueError, match=r"'my_reward' returned 1000.* for completion 1, which is too large for a float"
    ):
        check_reward_output("my_reward", [0.0, 10**400])


@pytest.mark.parametrize(
    "output", [[1.0, None, 0], (True, 2.5), np.array([0.5, 1.0]), torch.tensor([0.5, 1.0]), [np.float32(1.0)]]
)
def test_every_reward_list_trl_accepts_passes(output):
    check_reward_output("my_reward", output)


def test_a_reward_function_returning_a_number_is_an_error_naming_it(tiny_model_path, prompts, make_config):
    def total_length(completions, **kwargs):
        return float(sum(len(c) for c in completions))  # one number for the batch, not one per completion

    trainer = ESTrainer(model=tiny_model_path, reward_funcs=total_length, args=make_config(), train_dataset=prompts)
    with pytest.raises(TypeError, match=r"reward function 'total_length' returned .* \(a float\)"):
        trainer.train()


def test_all_nan_rewards_are_reported_as_nan_not_none(tiny_model_path, prompts, make_config, caplog):
    def undefined(completions, **kwargs):
        return [float("nan")] * len(completions)

    config = make_config(max_steps=1)
    trainer = ESTrainer(model=tiny_model_path, reward_funcs=undefined, args=config, train_dataset=prompts)
    with caplog.at_level(logging.WARNING, logger="trl_es"):
        trainer.train()
    warned = [r.message for r in caplog.records if "no completion of any member was scored" in r.message]
    assert len(warned) == 1 and "'undefined' returned NaN for every completion" in warned[0]
    assert "None" not in warned[0]


def test_a_reward_function_that_raises_propagates_its_error(tiny_model_path, prompts, make_config):
    def broken(completions, **kwargs):
        raise KeyError("answer")

    trainer = ESTrainer(model=tiny_model_path, reward_funcs=broken, args=make_config(), train_dataset=prompts)
    with pytest.raises(KeyError, match="answer"):
        trainer.train()
