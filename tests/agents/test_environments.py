"""Environments for ES (`trl_es.agents.environments`): GRPO's contract (tools, reset arguments, observations), one
instance per (member, row) reused across steps, and the same episode for every member."""

import random

import pytest

from trl_es.agents.environments import EnvironmentPool, environment_factories, environment_tools, with_observation


class Dice:
    created = 0

    def __init__(self):
        Dice.created += 1
        self.face, self.reset_with = None, None

    def reset(self, **kwargs):
        self.reset_with = kwargs
        self.face = random.randint(1, 6)
        return f" You rolled {self.face}."

    def peek(self) -> int:
        """The face."""
        return self.face

    def get_reward(self) -> float:
        return float(self.face)

    def _private(self):
        pass

    @property
    def expensive(self):
        raise AssertionError("properties are not evaluated")


def test_an_environments_tools_are_its_public_methods_but_reset_and_get_reward():
    assert [tool.__name__ for tool in environment_tools(Dice())] == ["peek"]


def test_instances_are_distinct_per_slot_and_reused_across_steps():
    Dice.created = 0
    pool = EnvironmentPool(environment_factories(Dice))
    first = pool.instances([None] * 4)
    second = pool.instances([None] * 3)
    assert len({id(env) for env in first}) == 4 and Dice.created == 4
    assert [id(env) for env in second] == [id(env) for env in first[:3]]


def test_every_member_meets_the_same_episode_from_a_seeded_reset():
    pool = EnvironmentPool(environment_factories(Dice))
    members = pool.instances([None] * 8)
    observations = [pool.reset(env, {"prompt": "p", "level": 2}, seed=7) for env in members]
    assert len(set(observations)) == 1 and members[0].reset_with == {"prompt": "p", "level": 2}
    faces = {pool.reset(env, {"prompt": "p"}, seed=seed) for seed, env in enumerate(members)}
    assert len(faces) > 1  # other rows (seeds) draw other episodes


def test_the_environment_column_picks_among_named_environments_and_is_not_passed_to_reset():
    pool = EnvironmentPool(environment_factories({"dice": Dice, "other": Dice}))
    assert pool.environment_of({"environment": "other"}) == "other"
    env = pool.instances(["dice"])[0]
    pool.reset(env, {"environment": "dice", "task": 1}, seed=None)
    assert env.reset_with == {"task": 1}
    with pytest.raises(ValueError, match=r"environment='missing'.*Expected one of: \['dice', 'other'\]"):
        pool.environment_of({"environment": "missing"})


def test_an_observation_extends_the_last_message_as_grpo_appends_it():
    prompt = [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}]
    assert with_observation(prompt, " there")[-1] == {"role": "user", "content": "hi there"}
    assert with_observation(prompt, None) is prompt
    blocks = with_observation(prompt, [{"type": "text", "text": "x"}])[-1]["content"]
    assert blocks == [{"type": "text", "text": "hi"}, {"type": "text", "text": "x"}]
