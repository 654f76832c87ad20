"""EVOLM: one model as policy and rubric generator, a small frozen judge, alternating phases trained with GRPO or ES.

- `prompts.py`: the prompt templates (policy, rubric generation, policy-with-rubric, judge, inferred question);
- `rubrics.py`: the rubric JSON schema, a strict parser and the validator;
- `judges/`: the `Judge` interface, running judges, and the OpenAI-compatible HTTP and in-process Hugging Face judges;
- `rewards.py`: the policy, rubric and format rewards with TRL's reward-function contract;
- `replay.py`: the replay buffer of past answers behind temporal contrast;
- `pairs.py`: preference pairs from the model's own outputs (temporal contrast with a replay buffer, inferred question,
  rubric-conditioned) and their mixture;
- `config.py`: `EvolmConfig`, how the phases alternate, what they sample and how the rubric rewards weigh;
- `generation.py`: text in, text out, as the phases' datasets and probes generate;
- `vllm_generation.py`: the same through a vLLM engine of the phase's starting model, for roles trained with vLLM;
- `diagnostics.py`: what each phase logs about both roles (and, with an evaluation-only `EvalVerifier`, accuracy,
  net signal, pair balance);
- `live_rubrics.py`: rubrics written per step by the model being trained (`EvolmConfig.live_rubrics`);
- `guard.py`: the reward-hacking guard, a verified probe that stops or rolls back a gamed phase;
- `trainer.py`: `EvolmTrainer`, the alternating phases over one model, each an ESTrainer or a GRPOTrainer.
"""

from .config import EvolmConfig
from .diagnostics import EvalVerifier
from .guard import RewardHackingError, RewardHackingGuard
from .judges import HFJudge, Judge, JudgeError, JudgePanel, OpenAIJudge, probe_judge, score_all
from .live_rubrics import LiveRubrics
from .pairs import Pair, PairMixture
from .prompts import Prompts
from .replay import ReplayBuffer
from .rewards import format_reward, policy_reward, rubric_reward
from .rubrics import Rubric, RubricError, RubricRules, parse_rubric
from .trainer import EvolmTrainer

__all__ = [
    "EvalVerifier",
    "EvolmConfig",
    "EvolmTrainer",
    "HFJudge",
    "Judge",
    "JudgeError",
    "JudgePanel",
    "LiveRubrics",
    "OpenAIJudge",
    "Pair",
    "PairMixture",
    "Prompts",
    "RewardHackingError",
    "RewardHackingGuard",
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
