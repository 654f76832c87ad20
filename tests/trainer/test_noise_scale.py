"""Sigma that changes over a run (`sigma_schedule`, `sigma_target_js_diversity`): each step's members are drawn with
that step's sigma, the adaptive sigma follows its rule from the logged JS diversity, and a resume continues it."""

import json
from pathlib import Path

import pytest
import torch
from scripts.fast_es import MOVING

from trl_es import ESTrainer
from trl_es.core.sigma_schedule import adapted_sigma
from trl_es.testing import digit_fraction

CONSTANT_LR = dict(MOVING, lr_scheduler_type="constant")  # a resumed shorter run keeps the same step size


def train(tiny_model_path, prompts, config, resume_from=None) -> ESTrainer:
    trainer = ESTrainer(model=tiny_model_path, reward_funcs=digit_fraction, args=config, train_dataset=prompts)
    trainer.train(resume_from_checkpoint=resume_from)
    return trainer


def logged(trainer, key):
    return [entry[key] for entry in trainer.state.log_history if key in entry]


def assert_same_weights(first, second):
    different = [n for n, p in first.model.named_parameters() if not torch.equal(p, second.model.get_parameter(n))]
    assert not different, f"{len(different)} tensors differ, e.g. {different[:3]}"


def test_a_sigma_schedule_draws_each_steps_members_with_its_sigma(tiny_model_path, prompts, make_config, tmp_path):
    """A linear schedule from 0.05 to 0.01 over two steps is the run of one step at sigma 0.05 resumed for a second
    at sigma 0.01, bit for bit."""
    scheduled = make_config(**CONSTANT_LR, sigma_schedule="linear", sigma_final=0.01, output_dir=tmp_path / "a")
    scheduled = train(tiny_model_path, prompts, scheduled)
    assert logged(scheduled, "es/sigma") == pytest.approx([0.05, 0.01])

    first = make_config(**CONSTANT_LR, max_steps=1, save_strategy="steps", save_steps=1, output_dir=tmp_path / "b")
    train(tiny_model_path, prompts, first)
    second = make_config(**{**CONSTANT_LR, "sigma": 0.01}, output_dir=tmp_path / "b")
    by_hand = train(tiny_model_path, prompts, second, resume_from=str(tmp_path / "b" / "checkpoint-1"))
    assert_same_weights(scheduled, by_hand)
    constant = train(tiny_model_path, prompts, make_config(**CONSTANT_LR, output_dir=tmp_path / "c"))
    assert not torch.equal(constant.model.lm_head.weight, scheduled.model.lm_head.weight)  # the schedule mattered


def adaptive_config(make_config, **overrides):
    # A target far above what 4 tiny members reach: sigma rises every step.
    return make_config(**MOVING, sigma_target_js_diversity=0.9, sigma_adaptation_rate=0.3, **overrides)


def test_the_adaptive_sigma_follows_the_logged_js_diversity(tiny_model_path, prompts, make_config):
    trainer = train(tiny_model_path, prompts, adaptive_config(make_config, max_steps=4))
    sigmas, diversities = logged(trainer, "es/sigma"), logged(trainer, "es/js_diversity")
    assert len(sigmas) == len(diversities) == 4 and sigmas[0] == MOVING["sigma"]
    for step in range(3):
        expected = adapted_sigma(sigmas[step], MOVING["sigma"], diversities[step], 0.9, 0.3)
        assert sigmas[step + 1] == pytest.approx(expected, rel=1e-6)
    assert sigmas[-1] > sigmas[0]


def test_a_resume_continues_the_adaptive_sigma_bit_for_bit(tiny_model_path, prompts, make_config):
    config = adaptive_config(make_config, max_steps=4, save_strategy="steps", save_steps=2)
    uninterrupted = train(tiny_model_path, prompts, config)
    saved = json.loads((Path(config.output_dir) / "checkpoint-2" / "es_state" / "es_state.json").read_text())
    assert saved["adaptive_sigma"] == pytest.approx(logged(uninterrupted, "es/sigma")[2])

    resumed = train(tiny_model_path, prompts, config, resume_from=str(Path(config.output_dir) / "checkpoint-2"))
    assert_same_weights(uninterrupted, resumed)
    assert resumed._noise_scale.current == uninterrupted._noise_scale.current != MOVING["sigma"]
