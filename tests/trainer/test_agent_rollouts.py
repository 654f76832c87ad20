"""ESTrainer with GRPO's agent features (`trl_es.trainer.agent_rollouts`): environments reset alike for every member,
truncated completions under `mask_truncated_completions`, and runs with environments resumed bit for bit. The loop's
own semantics are tested in tests/agents/, TRL's agent tests under ESTrainer in tests/integration/."""

import random

import pytest
import torch
from datasets import Dataset
from safetensors.torch import load_file
from scripts.fast_es import MOVING

from trl_es import ESTrainer
from trl_es.testing import build_tiny_qwen2, build_tool_tokenizer


class DiceGame:
    """A stochastic environment: the episode (a die's face) is drawn at reset, and each roll draws again."""

    def reset(self, **kwargs):
        self.face = random.randint(1, 6)
        return f" The die shows {self.face}."

    def roll(self) -> int:
        """Roll the die again.

        Returns:
            The new face.
        """
        self.face = random.randint(1, 6)
        return self.face

    def get_reward(self) -> float:
        return float(self.face)


def conversations(count: int) -> Dataset:
    return Dataset.from_dict({"prompt": [[{"role": "user", "content": f"Play {k}."}] for k in range(count)]})


@pytest.fixture(scope="module")
def tool_model_path(tmp_path_factory):
    """The tiny Qwen2 with the tool-calling tokenizer, its outputs peaked so that members differ."""
    path = tmp_path_factory.mktemp("tiny-tool-model")
    tokenizer = build_tool_tokenizer()
    build_tiny_qwen2(tokenizer, initializer_range=0.3).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def recorder(records: list):
    """A reward function that records each member's prompts, completions and environments' faces."""

    def record(prompts, completions, completion_ids, environments=None, **kwargs):
        faces = [environment.face for environment in environments] if environments else None
        records.append({"prompts": prompts, "completion_ids": completion_ids, "faces": faces})
        return [float(len(ids)) for ids in completion_ids]

    return record


def test_members_with_the_same_weights_meet_the_same_episodes_and_answer_alike(tool_model_path, make_config):
    """Common random numbers: every member's environment of a row is reset with the same seed, so members whose
    weights are the same (numerically: sigma=1e-12) play the same episode and write the same completions, while the
    rows of a step (and the steps) draw different episodes."""
    records = []
    config = make_config(sigma=1e-12, temperature=1.0, max_steps=2, max_completion_length=16)
    trainer = ESTrainer(model=tool_model_path, reward_funcs=recorder(records), args=config,
                        train_dataset=conversations(8), environment_factory=DiceGame)  # fmt: skip
    trainer.train()
    population = config.population_size
    assert len(records) == 2 * population  # one reward call per member and step
    for step in range(2):
        members = records[step * population : (step + 1) * population]
        assert all(member == members[0] for member in members[1:])
        assert len({prompt[-1]["content"] for prompt in members[0]["prompts"]}) > 1  # rows drew other episodes
    assert records[0]["prompts"] != records[population]["prompts"]  # so did the next step


def test_environments_are_reset_for_every_member_and_reward_functions_see_each_members_own(
    tool_model_path, make_config
):
    records = []
    config = make_config(**MOVING, max_steps=1, max_completion_length=16)
    trainer = ESTrainer(model=tool_model_path, reward_funcs=recorder(records), args=config,
                        train_dataset=conversations(8), environment_factory=DiceGame)  # fmt: skip
    trainer.train()
    assert trainer.reward_func_names == ["record", "DiceGame"]  # the environment's own reward, as GRPO adds it
    faces = [record["faces"] for record in records]
    observed = [[int(prompt[-1]["content"][-2]) for prompt in record["prompts"]] for record in records]
    assert faces == observed  # no tool was called: each member's environments hold the faces its prompts show
    instances = {id(environment) for environment in trainer.environments}
    assert len(instances) == len(trainer.environments)  # one instance per row


def suppress_end(tokenizer) -> dict:
    return {"suppress_tokens": [tokenizer.eos_token_id, tokenizer.pad_token_id]}


def eos_model(tmp_path, end_fraction: float) -> str:
    """A tiny model whose completions end early often: `end_fraction` of its vocabulary counts as EOS."""
    tokenizer = build_tool_tokenizer()
    model = build_tiny_qwen2(tokenizer, initializer_range=0.3)
    ends = list(range(int(len(tokenizer) * end_fraction)))
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, *ends]
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    return str(tmp_path)


@pytest.mark.parametrize("mask", [True, False])
def test_a_truncated_completion_adds_nothing_to_its_members_fitness_with_mask_truncated_completions(
    tmp_path, make_config, mask
):
    """`mask_truncated_completions`: a completion that ends without EOS is left unscored (GRPO leaves it out of the
    loss), so a member's fitness is the mean reward of its completions that ended; without it, of all of them."""
    model_path = eos_model(tmp_path / "model", end_fraction=0.2)
    rewards = []

    def reward(completion_ids, **kwargs):
        values = [float(len(ids) + row) for row, ids in enumerate(completion_ids)]
        rewards.append((completion_ids, values))
        return values

    config = make_config(**MOVING, max_steps=1, max_completion_length=4, mask_truncated_completions=mask)
    trainer = ESTrainer(model=model_path, reward_funcs=reward, args=config, train_dataset=conversations(8))
    trainer.train()
    end_ids = trainer.tokens.end_ids
    fitness = []
    for completion_ids, values in rewards:
        kept = [value for ids, value in zip(completion_ids, values, strict=True) if not mask or ids[-1] in end_ids]
        fitness.append(sum(kept) / len(kept))
    truncated = sum(ids[-1] not in end_ids for completion_ids, _ in rewards for ids in completion_ids)
    assert 0 < truncated < 4 * 4  # the step has both kinds, so the two settings can differ
    logged = trainer.state.log_history[0]
    assert logged["es/fitness/mean"] == pytest.approx(sum(fitness) / len(fitness), rel=1e-6)
    assert logged["es/fitness/max"] == pytest.approx(max(fitness), rel=1e-6)


def test_a_step_whose_completions_are_all_truncated_is_skipped_and_counted(tool_model_path, make_config, caplog):
    tokenizer = build_tool_tokenizer()
    config = make_config(**MOVING, max_steps=2, max_completion_length=3, mask_truncated_completions=True,
                         generation_kwargs=suppress_end(tokenizer))  # fmt: skip
    trainer = ESTrainer(model=tool_model_path, reward_funcs=lambda completions, **kw: [1.0] * len(completions),
                        args=config, train_dataset=conversations(8))  # fmt: skip
    before = {name: param.detach().clone() for name, param in trainer.model.named_parameters()}
    with caplog.at_level("WARNING", logger="trl_es"):
        trainer.train()
    assert trainer.state.log_history[1]["es/skipped_steps"] == 2.0
    assert "every completion of every member was truncated" in caplog.text and "max_completion_length=3" in caplog.text
    assert all(torch.equal(before[name], param) for name, param in trainer.model.named_parameters())


def test_a_run_with_environments_resumes_bitwise(tool_model_path, make_config, tmp_path):
    def train(output_dir, resume=None):
        config = make_config(**MOVING, output_dir=str(output_dir), max_steps=3, max_completion_length=16,
                             save_strategy="steps", save_steps=1)  # fmt: skip
        trainer = ESTrainer(model=tool_model_path, reward_funcs=recorder([]), args=config,
                            train_dataset=conversations(8), environment_factory=DiceGame)  # fmt: skip
        trainer.train(resume_from_checkpoint=resume)
        return load_file(f"{output_dir}/checkpoint-3/model.safetensors")

    uninterrupted = train(tmp_path / "a")
    train(tmp_path / "b")
    resumed = train(tmp_path / "b", resume=str(tmp_path / "b" / "checkpoint-1"))
    assert uninterrupted.keys() == resumed.keys()
    assert all(torch.equal(uninterrupted[name], resumed[name]) for name in uninterrupted)


def test_agents_on_a_tensor_parallel_engine_are_refused_naming_the_alternatives():
    """Every process of a tensor-parallel engine generates its members' turns, so each would run every tool call."""
    from types import SimpleNamespace

    from trl_es.trainer.agent_rollouts import AgentRollouts

    settings = SimpleNamespace(use_vllm=True, vllm_mode="colocate", vllm_tensor_parallel_size=2, perturbation="full")
    with pytest.raises(NotImplementedError, match="vllm_tensor_parallel_size=2 yet.*vllm_mode='server'"):
        AgentRollouts(None, DiceGame, None).check_settings(settings)
    AgentRollouts(None, None, None).check_settings(settings)  # no agents: nothing to refuse
