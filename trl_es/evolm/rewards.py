"""The rewards of EVOLM's two roles and the rubric format reward, as TRL reward functions.

Each factory returns `f(prompts, completions, completion_ids=None, **kwargs) -> list[float | None]`, the contract of
`GRPOTrainer` and `ESTrainer`: dataset columns arrive as keyword lists, completions are strings or
`[{"role": "assistant", "content": ...}]` lists, `None` means "no score" (here: the judge failed), and the function's
`__name__` (`policy_reward`, `rubric_reward`, `format_reward`) names its metric, `rewards/<name>/mean`. Every judge
call of one reward call goes to the judge at once (`score_all`), so a remote judge answers them concurrently.

Metrics (through TRL's `log_metric`, averaged over the step; a rate over no judge call is not logged):
- `judge/failure_rate`: the judge calls that returned `None`;
- `policy/rubric_valid_rate` (policy reward): the rows whose rubric column holds a valid rubric;
- `rubric/valid_rate`, `rubric/mean_margin` (rubric reward): the completions that are valid rubrics, and the mean
  of J+ − J− over the pairs the judge scored.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

from .judges import Judge, score_all
from .rubrics import DEFAULT_RULES, Rubric, RubricError, RubricRules, parse_rubric, rubric_is_valid

RewardFunction = Callable[..., list[float | None]]
RubricRewardMode = Literal["indicator", "margin", "log_sigmoid"]
RUBRIC_REWARD_MODES = ("indicator", "margin", "log_sigmoid")


def policy_reward(
    judge: Judge,
    question_column: str = "question",
    rubric_column: str = "rubric",
    rules: RubricRules = DEFAULT_RULES,
) -> RewardFunction:
    """The policy's reward: the judge's score in [0, 1] of each completion under its row's rubric.

    A row whose rubric column is not a valid rubric scores 0 without a judge call (`policy/rubric_valid_rate` counts
    them); a judge failure scores `None`. The judge reads the rubric as `Rubric.to_json` writes it.

    Args:
        judge (`Judge`):
            The frozen judge (`trl_es.evolm.judges`).
        question_column (`str`, *optional*, defaults to `"question"`):
            The dataset column with the question the judge reads (the prompt may wrap it in a template).
        rubric_column (`str`, *optional*, defaults to `"rubric"`):
            The dataset column with each row's rubric as JSON text.
        rules (`RubricRules`, *optional*):
            What makes a rubric valid.
    """

    def policy_reward(prompts, completions, completion_ids=None, log_metric=None, **kwargs) -> list[float | None]:
        questions = _column(kwargs, question_column, "policy_reward", "question_column")
        rubrics = [
            _rubric_or_none(text, rules) for text in _column(kwargs, rubric_column, "policy_reward", "rubric_column")
        ]
        rows = [row for row, rubric in enumerate(rubrics) if rubric is not None]
        items = [(questions[row], rubrics[row].to_json(), completion_text(completions[row])) for row in rows]
        scores = _judge(judge, items)
        rewards: list[float | None] = [0.0] * len(completions)
        for row, score in zip(rows, scores, strict=True):
            rewards[row] = score
        _log_mean(log_metric, "policy/rubric_valid_rate", [rubric is not None for rubric in rubrics])
        _log_mean(log_metric, "judge/failure_rate", [score is None for score in scores])
        return rewards

    return policy_reward


def rubric_reward(
    judge: Judge,
    mode: RubricRewardMode = "indicator",
    question_column: str = "question",
    chosen_column: str = "chosen",
    rejected_column: str = "rejected",
    rules: RubricRules = DEFAULT_RULES,
    margin_scale: float = 1.0,
    invalid_score: float | None = None,
) -> RewardFunction:
    """The rubric generator's reward: how well its rubric (the completion) makes the judge prefer the chosen answer.

    With J+ and J− the judge's scores of the row's chosen and rejected answers under the rubric:
    - `"indicator"`: 1 if J+ > J− else 0 (a tie is 0): the EVOLM authors' default;
    - `"margin"`: J+ − J−, in [−1, 1]: the authors' `margin_reward` flag;
    - `"log_sigmoid"`: log σ(margin_scale · (J+ − J−)): the paper's E[log σ(J+ − J−)]. With scores in [0, 1] and the
      paper's scale 1 it spans only [−1.31, −0.31]; a larger `margin_scale` sharpens it toward the indicator.

    A completion that is not a valid rubric is not judged and scores `invalid_score`, by default as a rubric that ranks
    the pair as wrongly as possible (J+ − J− = −1): 0 for the indicator, −1 for the margin, log σ(−margin_scale).
    Scoring it 0 in every mode would make an invalid rubric beat every valid one under the log-sigmoid (whose values
    are all < 0) and every wrong one under the margin. A judge failure on either answer scores `None`.

    Args:
        judge (`Judge`):
            The frozen judge (`trl_es.evolm.judges`).
        mode (`str`, *optional*, defaults to `"indicator"`):
            `"indicator"`, `"margin"` or `"log_sigmoid"`, as above.
        question_column (`str`, *optional*, defaults to `"question"`):
            The dataset column with the question the judge reads.
        chosen_column (`str`, *optional*, defaults to `"chosen"`):
            The dataset column with the preferred answer (a+).
        rejected_column (`str`, *optional*, defaults to `"rejected"`):
            The dataset column with the dispreferred answer (a−).
        rules (`RubricRules`, *optional*):
            What makes a rubric valid.
        margin_scale (`float`, *optional*, defaults to `1.0`):
            The scale of the margin inside the log-sigmoid (`mode="log_sigmoid"` only).
        invalid_score (`float`, *optional*):
            The reward of a completion that is not a valid rubric (default: as above).
    """
    to_reward = _margin_to_reward(mode, margin_scale)
    invalid_reward = to_reward(-1.0) if invalid_score is None else float(invalid_score)

    def rubric_reward(prompts, completions, completion_ids=None, log_metric=None, **kwargs) -> list[float | None]:
        questions = _column(kwargs, question_column, "rubric_reward", "question_column")
        chosen = _column(kwargs, chosen_column, "rubric_reward", "chosen_column")
        rejected = _column(kwargs, rejected_column, "rubric_reward", "rejected_column")
        rubrics = [_rubric_or_none(completion_text(completion), rules) for completion in completions]
        rows = [row for row, rubric in enumerate(rubrics) if rubric is not None]
        items = []
        for row in rows:
            rubric = rubrics[row].to_json()
            # The answer columns may hold strings or assistant messages, as completions do.
            items += [
                (questions[row], rubric, completion_text(chosen[row])),
                (questions[row], rubric, completion_text(rejected[row])),
            ]
        scores = _judge(judge, items)  # chosen, rejected, chosen, rejected, ...
        rewards: list[float | None] = [invalid_reward] * len(completions)
        margins = []
        for row, chosen_score, rejected_score in zip(rows, scores[::2], scores[1::2], strict=True):
            if chosen_score is None or rejected_score is None:
                rewards[row] = None
                continue
            margins.append(chosen_score - rejected_score)
            rewards[row] = to_reward(margins[-1])
        _log_mean(log_metric, "rubric/valid_rate", [rubric is not None for rubric in rubrics])
        _log_mean(log_metric, "rubric/mean_margin", margins)
        _log_mean(log_metric, "judge/failure_rate", [score is None for score in scores])
        return rewards

    return rubric_reward


def format_reward(rules: RubricRules = DEFAULT_RULES) -> RewardFunction:
    """The rubric format reward: 1.0 for a completion that is a valid rubric (`rubric_is_valid`), 0.0 otherwise.

    Args:
        rules (`RubricRules`, *optional*):
            What makes a rubric valid.
    """

    def format_reward(prompts, completions, completion_ids=None, **kwargs) -> list[float | None]:
        return [1.0 if rubric_is_valid(completion_text(completion), rules) else 0.0 for completion in completions]

    return format_reward


def completion_text(completion: str | list[dict[str, Any]]) -> str:
    """The text of a completion: the string itself, or the content of the last message of a conversational one."""
    if isinstance(completion, str):
        return completion
    return completion[-1]["content"] or ""


def _margin_to_reward(mode: str, margin_scale: float) -> Callable[[float], float]:
    if mode not in RUBRIC_REWARD_MODES:
        raise ValueError(f"`mode` must be one of {RUBRIC_REWARD_MODES}, got {mode!r}.")
    if not margin_scale > 0:
        raise ValueError(f"`margin_scale` must be > 0, got {margin_scale!r}.")
    if margin_scale != 1.0 and mode != "log_sigmoid":
        raise ValueError(
            f"`margin_scale={margin_scale}` only applies to `mode='log_sigmoid'` (got mode={mode!r}); leave it at 1.0."
        )
    if mode == "indicator":
        return lambda margin: 1.0 if margin > 0 else 0.0
    if mode == "margin":
        return float
    return lambda margin: _log_sigmoid(margin_scale * margin)


def _log_sigmoid(x: float) -> float:
    """log σ(x) = −log(1 + e^−x), in a form that does not overflow for large |x|."""
    return -math.log1p(math.exp(-x)) if x >= 0 else x - math.log1p(math.exp(x))


def _rubric_or_none(text: str, rules: RubricRules) -> Rubric | None:
    try:
        return parse_rubric(text, rules)
    except RubricError:
        return None


def _column(kwargs: dict[str, Any], name: str, reward: str, argument: str) -> list:
    if name not in kwargs:
        columns = sorted(key for key in kwargs if key not in ("trainer_state", "log_extra", "environments"))
        raise ValueError(
            f"{reward} reads the dataset column {name!r}, which the batch lacks (columns: {columns}). Add it to the "
            f"dataset or pass `{argument}=` the column that holds it."
        )
    return kwargs[name]


def _judge(judge: Judge, items: Sequence[tuple[str, str, str]]) -> list[float | None]:
    """The judge's scores of `(question, rubric, response)` items, all sent at once; a score outside [0, 1] is an
    error in the judge, not a reward."""
    if not items:
        return []
    scores = score_all(judge, items)
    for score in scores:
        if score is not None and not 0 <= score <= 1:
            raise ValueError(
                f"The judge {type(judge).__name__} returned the score {score!r}; a judge must return a score in "
                "[0, 1], or None when it failed."
            )
    return list(scores)


def _log_mean(log_metric: Callable[[str, float], None] | None, name: str, values: Sequence[float]) -> None:
    """Log the mean of `values` as `name` when the trainer passed `log_metric` and there are values (a rate over
    nothing is not a rate)."""
    if log_metric is not None and values:
        log_metric(name, sum(values) / len(values))
