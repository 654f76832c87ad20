"""Environments for ES: one instance per (member, row) of an ES step, reset with the same seed for every member.

GRPOTrainer keeps one instance per row of its batch, taken from a pool that it reuses across steps ("construct once,
reset often"). ES runs the same rows once per member, so a group of members that generate together needs one instance
per member and row; the pool keeps them across steps and grows only when a step needs more. Every member's instance
of row `j` is reset with the global generators seeded alike (`common_random.seeded_globals`), so an environment that
draws its episode at `reset` gives every member the same one. An environment's public methods are its tools, exactly
as in GRPO (`reset` and `get_reward` excepted).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from .common_random import seeded_globals

RESERVED_METHODS = ("reset", "get_reward")


def environment_factories(environment_factory) -> dict[str | None, Callable] | None:
    """`environment_factory` as GRPO reads it: a dict names several environments (each row's `environment` column
    picks one); anything else is the one environment of every row (named None)."""
    if environment_factory is None:
        return None
    if isinstance(environment_factory, dict):
        return dict(environment_factory)
    return {None: environment_factory}


def environment_tools(environment) -> list[Callable]:
    """The environment's public methods (listed on its class, so properties are not evaluated), bound to it: its
    tools, as GRPO exposes them."""
    return [
        getattr(environment, name)
        for name, _ in inspect.getmembers(type(environment), predicate=inspect.isfunction)
        if name not in RESERVED_METHODS and not name.startswith("_")
    ]


class EnvironmentPool:
    """The environment instances of ES steps: `instances(names)` gives one instance per slot (member x row of a
    group), reused from earlier steps where the pool has them.

    Args:
        factories (`dict`): `{name: factory}` (see `environment_factories`).
    """

    def __init__(self, factories: Mapping[str | None, Callable]):
        self.factories = dict(factories)
        self.pool: dict[str | None, list] = {name: [] for name in self.factories}

    def environment_of(self, row: Mapping[str, Any]) -> str | None:
        """The environment a dataset row selects: its `environment` column when there are several, else the one."""
        if list(self.factories) == [None]:
            return None
        name = row.get("environment")
        if name not in self.factories:
            raise ValueError(
                f"Example has `environment={name!r}`, which is not among the environments passed to "
                f"`environment_factory`. Expected one of: {list(self.factories)}."
            )
        return name

    def instances(self, names: list[str | None]) -> list:
        """One instance per entry of `names` (the environment of each slot), distinct, reused where possible."""
        taken: dict[str | None, int] = {}
        chosen = []
        for name in names:
            pool = self.pool[name]
            index = taken.get(name, 0)
            if index == len(pool):
                pool.append(self.factories[name]())
            taken[name] = index + 1
            chosen.append(pool[index])
        return chosen

    def reset(self, environment, row: Mapping[str, Any], seed: int | None):
        """Reset `environment` for dataset row `row` (its columns as keyword arguments, without `environment` when
        several environments are named, as GRPO does), the global generators seeded with `seed`; returns what reset
        returned (an observation to append to the prompt, or None)."""
        kwargs = (
            {key: value for key, value in row.items() if key != "environment"} if None not in self.factories else row
        )
        with seeded_globals(seed):
            return environment.reset(**kwargs)


def with_observation(prompt: list[dict], observation) -> list[dict]:
    """The conversation `prompt` with a reset's observation appended to its last message's content, as GRPO does (a
    string to a string, with no separator; text or content blocks to content blocks)."""
    if observation is None:
        return prompt
    content = prompt[-1]["content"]
    if isinstance(observation, list) and isinstance(content, str):
        content = [{"type": "text", "text": content}]
    if isinstance(observation, str) and isinstance(content, list):
        observation = [{"type": "text", "text": observation}]
    return [*prompt[:-1], {**prompt[-1], "content": content + observation}]
