"""What a rubric-lab run depends on: the methods (and the demo settings each one changes), `RubricLabSettings`
(saved in the results file), and the steps that give methods without rubric phases EVOLM's budget."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from trl_es.demo.evolm.settings import EvolmDemoSettings

MIXED = {"temporal": 1.0, "inferred": 1.0, "rubric_conditioned": 1.0}
NO_TEMPORAL = {"inferred": 1.0, "rubric_conditioned": 1.0}
# method -> the demo settings it changes (EVOLM methods) or None (the others)
METHODS: dict[str, dict | None] = {
    "base": None,
    "verifier": None,
    "static": {"schedule": "static"},
    "coevolve-temporal": {"pair_weights": {"temporal": 1.0}},
    "coevolve-conditioned": {"pair_weights": {"rubric_conditioned": 1.0}},
    "coevolve-inferred": {"pair_weights": {"inferred": 1.0}},
    "coevolve-mixed": {"pair_weights": MIXED},
    "coevolve-indicator": {"pair_weights": {"temporal": 1.0}, "rubric_reward": "indicator"},
    "coevolve-anchored": {"pair_weights": {"temporal": 1.0}, "kl_anchor_beta": 1.0},
    "coevolve-live": {"pair_weights": {"temporal": 1.0}, "live_rubrics": True},
    "static-greedy": {"schedule": "static", "rubric_temperature": 0.0},
    "sequential": {"schedule": "sequential", "pair_weights": NO_TEMPORAL},
    "grpo": {"pair_weights": {"temporal": 1.0}, "policy_method": "grpo", "rubric_method": "grpo"},
    "es-policy-grpo-rubric": {"pair_weights": {"temporal": 1.0}, "rubric_method": "grpo"},
    "grpo-policy-es-rubric": {"pair_weights": {"temporal": 1.0}, "policy_method": "grpo"},
    "scalar-rm": None,
}
MODELS = ("joint", "null")


@dataclass
class RubricLabSettings:
    """Everything a lab run depends on; saved in the JSON. Defaults are the full run."""

    # 1024 held-out problems (standard error of an accuracy ~0.015), and an evaluation-only verifier that every
    # phase's diagnostics read (128 other test problems as its held-out probe)
    demo: EvolmDemoSettings = field(
        default_factory=lambda: EvolmDemoSettings(num_held_out=1024, verifier_probe_size=128)
    )
    # the arms (`experiments.rubric_lab.arms`); 0: the shipped ones. Seed 2 fails a gate (docs: EVOLM, "Pretraining
    # seeds"), so the full run stops at 2 seeds, crossed with 3 training seeds: 6 runs per method and model
    pretraining_seeds: tuple[int, ...] = (0, 1)
    seeds: tuple[int, ...] = (0, 1, 2)
    models: tuple[str, ...] = MODELS
    methods: tuple[str, ...] = tuple(METHODS)
    rm_steps: int = 300  # Bradley-Terry training steps of the scalar reward model
    bootstrap_draws: int = 2000  # of the confidence intervals and standard errors (`experiments.rubric_lab.stats`)

    def policy_steps_at_equal_budget(self, judge_calls_per_completion: int) -> int:
        """Policy steps (in total) of a method without rubric phases that spend EVOLM's budget, when each completion
        costs `judge_calls_per_completion` calls besides itself (0: the verifier, 1: a judge or reward model)."""
        demo = self.demo
        policy, rubric = demo.completions_per_step("policy"), demo.completions_per_step("rubric")
        evolm = demo.rounds * (2 * policy * demo.policy_steps + 3 * rubric * demo.rubric_steps)
        return math.floor(evolm / ((1 + judge_calls_per_completion) * policy))


def quick_settings() -> RubricLabSettings:
    """A smoke test: short phases, one seed, few held-out problems."""
    demo = EvolmDemoSettings(
        policy_steps=4, rubric_steps=2, rounds=1, num_train=64, num_held_out=128, verifier_probe_size=16
    )
    return RubricLabSettings(demo=demo, pretraining_seeds=(0,), seeds=(0,), rm_steps=30)
