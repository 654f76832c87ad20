"""Training one rubric-lab method from an arm: EVOLM with the method's demo settings, or ES on the
verifier's or a reward model's reward for the steps that spend EVOLM's budget."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

from experiments.rubric_lab.reward_model import reward_model_reward, train_reward_model
from experiments.rubric_lab.settings import METHODS, RubricLabSettings


def train_method(settings: RubricLabSettings, start: Path, method: str, seed: int, folder: Path, judge) -> Path:
    """Train `method` from the arm in `start`; returns the final model's folder."""
    from trl_es.demo.evolm.run import train_evolm

    if method == "base":
        return start
    if method == "verifier":
        return train_on_reward(settings, start, "verifier", seed, folder)
    if method == "scalar-rm":
        reward_model = train_reward_model(settings, start, seed, folder / "reward_model")
        return train_on_reward(settings, start, reward_model, seed, folder)
    demo = replace(settings.demo, **METHODS[method])
    if demo.schedule == "static":
        steps = settings.policy_steps_at_equal_budget(1)
        demo = replace(demo, policy_steps=math.ceil(steps / demo.rounds))
    return train_evolm(start, demo, str(folder / "run"), seed, judge=judge)


def train_on_reward(settings: RubricLabSettings, start: Path, reward, seed: int, folder: Path) -> Path:
    """ES on the policy prompts with the verifier's reward (`reward="verifier"`) or a reward model's, for the steps
    that spend EVOLM's budget."""
    from datasets import Dataset

    from trl_es import ESTrainer
    from trl_es.demo.evolm.toy import DEMO_PROMPTS
    from trl_es.tasks.arithmetic import arithmetic_reward, problem

    demo = settings.demo
    problems = [problem("train", index) for index in range(demo.num_train)]
    columns = {"prompt": [DEMO_PROMPTS.policy.format(question=p.question) for p in problems]}
    if reward == "verifier":
        columns["answer"] = [str(p.answer) for p in problems]
        reward_funcs, calls = arithmetic_reward, 0
    else:
        columns["question"] = [p.question for p in problems]
        reward_funcs, calls = reward_model_reward(reward), 1
    steps = settings.policy_steps_at_equal_budget(calls)
    trainer = ESTrainer(
        model=str(start),
        reward_funcs=reward_funcs,
        args=replace(demo, policy_method="es").role_config("policy", str(folder / "run"), steps, seed),
        train_dataset=Dataset.from_dict(columns),
    )
    trainer.train()
    trainer.save_model(str(folder / "run" / "final"))
    return folder / "run" / "final"
