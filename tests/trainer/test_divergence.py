"""Divergence is caught, never saved (issue 16, points 1 and 4): a non-finite update is refused before it is applied
and stops training naming the step, the cause and the last good checkpoint; no NaN reaches a checkpoint; and steps
without an update direction are counted and warned about."""

import logging
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from scripts.fast_es import MOVING

from trl_es import ESTrainer
from trl_es.core.guards import NonFiniteError, check_fitness, first_infinite_reward
from trl_es.core.lowrank import LowRankMasterWeights
from trl_es.core.master import MasterWeights
from trl_es.testing import digit_fraction


def _master(value=1.0):
    return MasterWeights({"a.weight": torch.full((3, 2), value), "b.bias": torch.full((2,), value)}, sigma=0.1)


def _unchanged(master, value=1.0):
    return all(torch.equal(t, torch.full_like(t, value)) for t in master.tensors.values())


@pytest.mark.parametrize(
    ("update", "cause"),
    [
        (dict(coefficients={1: float("nan")}, lr=0.1), "coefficients of 1 members are not finite"),
        (dict(coefficients={1: 0.5}, lr=1e39), r"learning_rate=1e\+39 is not finite in float32"),
        (dict(coefficients={1: 0.5}, lr=0.1, weight_decay=float("nan")), "weight_decay"),
    ],
)
def test_a_non_finite_update_is_refused_before_any_weight_changes(update, cause):
    master = _master()
    with pytest.raises(NonFiniteError, match=cause):
        master.apply_update(**update)
    assert _unchanged(master)


def test_an_update_that_would_overflow_float32_is_refused_naming_the_learning_rate():
    master = _master(3e38)
    with pytest.raises(NonFiniteError, match=r"update of 'a.weight' would make it non-finite.*Lower learning_rate"):
        master.apply_update({1: 1.0}, lr=1e38)
    assert _unchanged(master, 3e38)


def test_an_overflow_found_partway_leaves_every_tensor_finite_and_names_the_one_that_overflowed():
    # The documented exception: tensors are stepped one at a time (the update of a whole model is not held at once),
    # so those before the overflowing one have taken their finite step; training stops and names the checkpoint.
    master = MasterWeights({"a.weight": torch.full((3, 2), 1.0), "b.bias": torch.full((2,), 3e38)}, sigma=0.1)
    with pytest.raises(NonFiniteError, match="update of 'b.bias' would make it non-finite"):
        master.apply_update({1: 1.0}, lr=1e38)
    assert torch.equal(master.tensors["b.bias"], torch.full((2,), 3e38))
    assert not torch.equal(master.tensors["a.weight"], torch.full((3, 2), 1.0))
    assert all(torch.isfinite(tensor).all() for tensor in master.tensors.values())


def test_a_low_rank_update_is_guarded_too():
    master = LowRankMasterWeights({"a.weight": torch.full((3, 2), 3e38)}, 0.1, {"a.weight"}, rank=1)
    with pytest.raises(NonFiniteError, match="'a.weight'"):
        master.apply_update({1: 1.0}, lr=1e38)
    assert torch.equal(master.tensors["a.weight"], torch.full((3, 2), 3e38))


def test_an_infinite_reward_is_found_and_nan_is_not_one():
    rewards = torch.tensor([[[0.5], [float("nan")]], [[1.0], [-float("inf")]]])  # (members, completions, functions)
    assert first_infinite_reward(rewards) == (1, 1, 0)
    assert first_infinite_reward(torch.tensor([[[float("nan")]]])) is None


def test_fitness_that_overflows_names_the_reward_weights():
    with pytest.raises(NonFiniteError, match=r"reward_weights=\[1e\+38\]"):
        check_fitness(torch.tensor([1.0, float("inf")]), [1e38])


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
