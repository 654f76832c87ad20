"""The frozen judge of EVOLM: scores a response against a rubric, in [0, 1].

- `base.py`: the [`Judge`] interface (one `async score(question, rubric, response)`; `None` means the judge failed),
  [`JudgeStats`] and [`parse_judge_output`];
- `running.py`: [`score_all`] (many items concurrently, from any thread, inside a running event loop or not) and
  [`probe_judge`] (a startup check that fails loudly, showing what the judge answered);
- `http.py`: [`OpenAIJudge`], an OpenAI-compatible server (`vllm serve Qwen/Qwen3-1.7B --port 8001`), over `aiohttp`;
- `hf.py`: [`HFJudge`], an in-process Hugging Face model, generating (`mode="generate"`) or reading the score's digit
  probabilities in one forward pass (`mode="logprob"`), and [`check_judge_is_not`];
- `panel.py`: [`JudgePanel`], several judges scoring as one (mean or median);
- `prompting.py`: what a judge reads, the judge template filled with fields that cannot close their fence or end the
  judge's turn ([`judge_prompt`], [`neutralise`]).
"""

from .base import PARSE_FAILURE, Judge, JudgeError, JudgeStats, parse_judge_output
from .hf import SCORE_PREFIX, HFJudge, check_judge_is_not
from .http import OpenAIJudge
from .panel import JudgePanel
from .running import PROBE_QUESTION, PROBE_RESPONSE, PROBE_RUBRIC, probe_judge, score_all

__all__ = [
    "PARSE_FAILURE",
    "PROBE_QUESTION",
    "PROBE_RESPONSE",
    "PROBE_RUBRIC",
    "SCORE_PREFIX",
    "HFJudge",
    "Judge",
    "JudgeError",
    "JudgePanel",
    "JudgeStats",
    "OpenAIJudge",
    "check_judge_is_not",
    "parse_judge_output",
    "probe_judge",
    "score_all",
]
