"""ESTrainer with `perturbation="lowrank"`: the population generates in batched calls, the update is the full-rank sum
of the members' low-rank terms, checkpoints resume, and it learns."""

from pathlib import Path

import pytest
import torch
from scripts.fast_es import MOVING

from trl_es import ESTrainer
from trl_es.core.fitness import shape_fitness
from trl_es.core.lowrank import lowrank_noise
from trl_es.core.noise import parameter_noise, population
from trl_es.testing import digit_fraction, digit_prompts

LOWRANK = dict(perturbation="lowrank", lowrank_rank=2)


def _train(model_path, config, reward=digit_fraction, dataset=None):
    trainer = ESTrainer(model=model_path, reward_funcs=reward, args=config, train_dataset=dataset or digit_prompts(8))
    trainer.train()
    return trainer


def _fitness_log(trainer):
    keys = ("es/fitness/mean", "es/fitness/std", "es/fitness/min", "es/fitness/max")
    return [tuple(entry[key] for key in keys) for entry in trainer.state.log_history if "es/fitness/mean" in entry]


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_the_whole_population_in_one_call_scores_like_one_member_per_call(peaked_model_path, make_config, temperature):
    # Sampled rows draw common random numbers per row, so batching members changes nothing either way.
    settings = dict(**LOWRANK, sigma=0.05, learning_rate=0.01, max_steps=2, temperature=temperature)
    together = _train(peaked_model_path, make_config(**settings))
    one_by_one = _train(peaked_model_path, make_config(**settings, population_batch_size=1))
    assert _fitness_log(together) == _fitness_log(one_by_one)
    assert any(std > 0 for _, std, _, _ in _fitness_log(together))  # the members really differed
    for name, master in together.population.master.tensors.items():
        assert torch.allclose(master, one_by_one.population.master.tensors[name], atol=1e-6), name


def test_one_step_applies_the_full_rank_sum_of_the_members_lowrank_terms(peaked_model_path, make_config):
    rewards_seen = []

    def recording_reward(completions, **kwargs):
        rewards = digit_fraction(completions)
        rewards_seen.extend(rewards)
        return rewards

    config = make_config(**LOWRANK, population_size=4, sigma=0.5, learning_rate=0.01, max_steps=1, temperature=1.0)
    trainer = ESTrainer(model=peaked_model_path, reward_funcs=recording_reward, args=config,
                        train_dataset=digit_prompts(8))  # fmt: skip
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()

    members = population(config.seed, step=0, population_size=4)
    fitness = torch.tensor(rewards_seen).view(4, -1).mean(dim=1)  # one batched call, rows member-major
    z = shape_fitness(fitness, "zscore")
    assert z.abs().sum() > 0, "the members must differ for this test to check anything"
    master = trainer.population.master
    assert "lm_head.weight" in master.lowrank_names and "model.norm.weight" not in master.lowrank_names
    for name, param in trainer.model.named_parameters():
        if name in master.lowrank_names:
            noise = [lowrank_noise(m.seed, name, param.shape, rank=2) for m in members]
        else:  # lowrank_other_parameters="full": norms get full-rank noise
            noise = [parameter_noise(m.seed, name, param.shape) for m in members]
        direction = sum((z[i].item() / 4) * noise[i] for i in range(4))
        assert torch.allclose(param, before[name] + 0.01 * direction, atol=1e-6), name


def test_frozen_other_parameters_stay_bitwise_unchanged(peaked_model_path, make_config):
    trainer = _train(peaked_model_path, make_config(**LOWRANK, **MOVING, lowrank_other_parameters="frozen"))
    start = ESTrainer(model=peaked_model_path, reward_funcs=digit_fraction, args=make_config(**LOWRANK),
                      train_dataset=digit_prompts(8)).model  # fmt: skip
    start_weights = dict(start.named_parameters())
    for name, param in trainer.model.named_parameters():
        if name in trainer.population.master.lowrank_names:
            assert not torch.equal(param, start_weights[name]), name
        else:
            assert torch.equal(param, start_weights[name]), name


def test_a_lowrank_run_resumes_bit_for_bit(peaked_model_path, make_config):
    config = make_config(**LOWRANK, **MOVING, max_steps=4, save_strategy="steps", save_steps=2)
    uninterrupted = _train(peaked_model_path, config)
    resumed = ESTrainer(
        model=peaked_model_path, reward_funcs=digit_fraction, args=config, train_dataset=digit_prompts(8)
    )
    resumed.train(resume_from_checkpoint=str(Path(config.output_dir) / "checkpoint-2"))
    for name, master in uninterrupted.population.master.tensors.items():
        assert torch.equal(master, resumed.population.master.tensors[name]), name


@pytest.mark.slow
def test_lowrank_es_learns_the_digit_task(peaked_model_path, make_config):
    # The settings of the original digits demo, where full-rank ES went from 0.16 to 0.94 in 60 steps; low-rank
    # (rank 2) went from 0.17 to 0.68 on the development machine.
    config = make_config(**LOWRANK, population_size=16, sigma=0.1, learning_rate=0.05, temperature=1.0,
                         max_steps=60, per_device_train_batch_size=16, max_completion_length=16)  # fmt: skip
    trainer = _train(peaked_model_path, config, dataset=digit_prompts(64))
    rewards = [entry["reward"] for entry in trainer.state.log_history if "reward" in entry]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + 0.25, (first, last)
