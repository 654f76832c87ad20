"""EVOLM: one model as policy and rubric generator, a small frozen judge, alternating phases trained with GRPO or ES.

- `prompts.py`: the prompt templates (policy, rubric generation, policy-with-rubric, judge, inferred question);
- `rubrics.py`: the rubric JSON schema, a strict parser and the validator;
- `judges/`: the `Judge` interface, running judges, and the OpenAI-compatible HTTP and in-process Hugging Face judges;
- `rewards.py`: the policy, rubric and format rewards with TRL's reward-function contract;
- `pairs.py`: preference pairs from the model's own outputs (temporal contrast with a replay buffer, inferred question,
  rubric-conditioned) and their mixture;
- `trainer.py`: `EvolmConfig` and `EvolmTrainer`, the alternating phases over one model, each an ESTrainer or a
  GRPOTrainer.
"""

from .judges import HFJudge, Judge, JudgeError, OpenAIJudge, probe_judge, score_all
from .pairs import Pair, PairMixture, ReplayBuffer
from .prompts import Prompts
from .rewards import format_reward, policy_reward, rubric_reward
from .rubrics import Rubric, RubricError, RubricRules, parse_rubric
from .trainer import EvolmConfig, EvolmTrainer

__all__ = [
    "EvolmConfig",
    "EvolmTrainer",
    "HFJudge",
    "Judge",
    "JudgeError",
    "OpenAIJudge",
    "Pair",
    "PairMixture",
    "Prompts",
    "ReplayBuffer",
    "Rubric",
    "RubricError",
    "RubricRules",
    "format_reward",
    "parse_rubric",
    "policy_reward",
    "probe_judge",
    "rubric_reward",
    "score_all",
]
