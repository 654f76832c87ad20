"""The KL anchor (`kl_anchor_beta`): a member's fitness is its mean reward minus beta times its KL from the run's
starting weights on a fixed probe, sampled once by those weights."""

import pytest
import torch
from scripts.fast_es import MOVING
from transformers import AutoModelForCausalLM, AutoTokenizer

from trl_es import ESTrainer
from trl_es.backends.hf import HFBackend, TokenIds
from trl_es.core.master import MasterWeights
from trl_es.core.noise import population
from trl_es.testing import digit_fraction
from trl_es.trainer.kl_probe import KLProbe


def logged(trainer, key):
    return [entry[key] for entry in trainer.state.log_history if key in entry]


def test_the_probe_reads_zero_kl_at_its_reference_and_more_for_farther_members(tiny_model_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    tokens = TokenIds.of(model, tokenizer)
    parameters = dict(model.named_parameters())
    prompt_ids = [tokenizer(f"Item {k}:")["input_ids"] for k in range(4)]
    probe = KLProbe.sample(model, tokens, prompt_ids, max_tokens=6, seed=0)
    assert probe.kl_of(model, tokens.pad) == 0.0
    kls = []
    for sigma in (0.01, 0.1):
        backend = HFBackend(model, parameters, MasterWeights(parameters, sigma), tokens)
        kls.append(probe.member_kl(backend, population(0, 0, 2, antithetic=False)))
    assert (kls[0] > 0).all() and (kls[1] > 10 * kls[0]).all(), kls
    assert probe.kl_of(model, tokens.pad) == 0.0, "the backend must hold the centre again"


def test_the_fitness_is_the_reward_less_the_logged_penalty(tiny_model_path, prompts, make_config):
    config = make_config(**MOVING, kl_anchor_beta=5.0, max_steps=2)
    trainer = ESTrainer(model=tiny_model_path, reward_funcs=digit_fraction, args=config, train_dataset=prompts)
    trainer.train()
    penalty, fitness, reward = (logged(trainer, key) for key in ("es/kl_penalty", "es/fitness/mean", "reward"))
    assert len(penalty) == 2 and all(value > 0 for value in penalty)
    assert fitness == pytest.approx([r - p for r, p in zip(reward, penalty, strict=True)], abs=1e-6)
    kl = logged(trainer, "kl")
    assert kl[0] == 0.0 and kl[1] > 0, "the centre starts at the reference, then moves"


def test_an_anchored_run_stays_nearer_its_start(tiny_model_path, prompts, make_config, tmp_path):
    distances = {}
    for beta in (0.0, 1e4):
        config = make_config(**MOVING, kl_anchor_beta=beta, max_steps=6, output_dir=tmp_path / f"beta-{beta}")
        trainer = ESTrainer(model=tiny_model_path, reward_funcs=digit_fraction, args=config, train_dataset=prompts)
        trainer.train()
        distances[beta] = logged(trainer, "es/param_distance")[-1]
    assert distances[1e4] < distances[0.0], distances


def test_a_resumed_run_keeps_the_probe_of_its_starting_weights(tiny_model_path, prompts, make_config, tmp_path):
    config = make_config(**MOVING, kl_anchor_beta=1.0, max_steps=2, save_strategy="steps", save_steps=1)
    first = ESTrainer(model=tiny_model_path, reward_funcs=digit_fraction, args=config, train_dataset=prompts)
    first.train()
    resumed = ESTrainer(model=tiny_model_path, reward_funcs=digit_fraction, args=config, train_dataset=prompts)
    resumed.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-1"))
    assert resumed._kl_probe.completion_ids == first._kl_probe.completion_ids
    assert torch.equal(resumed._kl_probe.reference_log_probs, first._kl_probe.reference_log_probs)
    # The history holds the checkpoint's step 1, then the resumed step 2, which measures as the first run did.
    assert logged(resumed, "kl") == pytest.approx(logged(first, "kl"), abs=1e-9) and logged(first, "kl")[1] > 0


def test_the_probe_prompts_can_be_given(tiny_model_path, prompts, make_config):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    probe_prompts = ["Count:", "Spell seven:"]
    config = make_config(kl_anchor_beta=1.0, max_steps=1)
    trainer = ESTrainer(
        model=tiny_model_path,
        reward_funcs=digit_fraction,
        args=config,
        train_dataset=prompts,
        kl_probe_prompts=probe_prompts,
    )
    trainer.train()
    assert trainer._kl_probe.prompt_ids == [tokenizer(p)["input_ids"] for p in probe_prompts]


@pytest.mark.parametrize("setting", [{"perturbation": "lowrank"}, {"use_vllm": True}])
def test_the_anchor_needs_full_rank_members_on_model_generate(setting, make_config):
    with pytest.raises(NotImplementedError, match="kl_anchor_beta=0.1 reads each member's log-probabilities"):
        make_config(kl_anchor_beta=0.1, **setting)


@pytest.mark.parametrize("size", [0, 2.5])
def test_the_probe_needs_prompts(size, make_config):
    with pytest.raises(ValueError, match=f"kl_anchor_probe_size must be an integer >= 1.*got {size}"):
        make_config(kl_anchor_probe_size=size)
