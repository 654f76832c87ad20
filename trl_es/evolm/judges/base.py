"""The judge interface: one `async score(question, rubric, response)` in [0, 1], `None` when the judge failed, and
the parsing of a judge's answer.

A judge failure is `None` (TRL's "no reward"), never a made-up score: the EVOLM authors' code turns a failed call into
`NaN`, or 0 in some scoring modes. Here failures are counted (`judge.stats`) and a judge that cannot work is stopped at
start (`probe_judge`).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass
from typing import Protocol, runtime_checkable

from ..prompts import Prompts

# Qwen3-style reasoning precedes the answer; its braces must not be mistaken for the answer's JSON.
_THINK_SPAN = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
PARSE_FAILURE = "its answer is not JSON with a score in [0, 1]"  # a judge's `last_error` after a parse failure
DEFAULT_PROMPTS = Prompts()  # frozen: safe as a shared default
RAW_SHOWN = 500  # characters of a judge's answer shown in an error message


class JudgeError(RuntimeError):
    """A judge that cannot work: misconfigured, unreachable at start, or answering in the wrong format."""


@runtime_checkable
class Judge(Protocol):
    """Scores a response to a question against a rubric."""

    async def score(self, question: str, rubric: str, response: str) -> float | None:
        """The score in [0, 1]; `None` only when the judge failed (unreachable, unparsable or out-of-range answer)."""
        ...


@dataclass
class JudgeStats:
    """Counts of a judge's work: `requests` (score calls), `failures` (calls that returned `None`),
    `parse_failures` (failures whose answer was not the expected JSON) and `retries` (HTTP attempts repeated)."""

    requests: int = 0
    failures: int = 0
    parse_failures: int = 0
    retries: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def parse_judge_output(text: str | None) -> float | None:
    """The score in a judge's answer, or `None` when the answer is not what the judge prompt asks for.

    The answer must hold exactly one JSON object, `{"reasoning": ..., "score": <number>}` with the score a JSON number
    in [0, 1] (`"reasoning"` may be missing). Text around the object, a ```` ```json ```` fence and `<think>` spans are
    tolerated. `None` for anything else: no object or several, no `score`, a score that is a string, a boolean, not
    finite or outside [0, 1] (it is never clipped: a judge scoring on another scale is a failure, not a 1).
    """
    if not isinstance(text, str):
        return None
    objects = _json_objects(_THINK_SPAN.sub("", text))
    if len(objects) != 1:
        return None
    score = objects[0].get("score")
    if isinstance(score, bool) or not isinstance(score, (int, float)):
        return None
    if not math.isfinite(score) or not 0.0 <= score <= 1.0:
        return None
    return float(score)


def _json_objects(text: str) -> list[dict]:
    """The top-level JSON objects that appear in `text`, in order."""
    decoder = json.JSONDecoder()
    objects, position = [], text.find("{")
    while position != -1:
        try:
            value, end = decoder.raw_decode(text, position)
        except json.JSONDecodeError:
            position = text.find("{", position + 1)
            continue
        objects.append(value)
        position = text.find("{", end)
    return objects


def check_positive(**values: float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise JudgeError(f"{name} must be > 0, got {value!r}.")
