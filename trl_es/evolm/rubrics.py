"""The rubric a model writes for a question: JSON criteria with weights, a strict parser and the validity check.

A rubric is the JSON object `{"criteria": [{"criterion": "<text>", "weight": <number>}, ...]}` that
`prompts.RUBRIC_GENERATION` asks for. It is valid when it has at least `min_criteria` criteria, every criterion has a
non-empty text and a weight > 0, and the weights sum to 1 within `weight_tolerance`: the format check of the EVOLM
authors (`is_valid_rubric_format` in stellalisy/EvoLM), with their values as defaults.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

# Reasoning models write `<think>...</think>` before their answer; a brace in there is not the rubric.
_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_FENCED_BLOCK = re.compile(r"```(?:json)?[ \t]*\n?(.*?)```", re.DOTALL | re.IGNORECASE)


class RubricError(ValueError):
    """A rubric's text is not a valid rubric; the message says what is wrong."""


@dataclass(frozen=True)
class RubricRules:
    """What makes a rubric valid (the defaults are the EVOLM authors' values).

    Args:
        min_criteria (`int`, *optional*, defaults to `2`):
            The fewest criteria a rubric may have.
        weight_tolerance (`float`, *optional*, defaults to `0.15`):
            How far the sum of the weights may be from 1.
    """

    min_criteria: int = 2
    weight_tolerance: float = 0.15

    def __post_init__(self):
        if isinstance(self.min_criteria, bool) or not isinstance(self.min_criteria, int) or self.min_criteria < 1:
            raise ValueError(f"`min_criteria` must be an integer >= 1, got {self.min_criteria!r}.")
        if not 0 <= self.weight_tolerance < 1:
            raise ValueError(
                f"`weight_tolerance` must be in [0, 1), got {self.weight_tolerance!r}: it is how far the weights' sum "
                "may be from 1."
            )


# The authors' rules, shared as a default argument (the dataclass is frozen).
DEFAULT_RULES = RubricRules()


@dataclass(frozen=True)
class Criterion:
    """One criterion of a rubric: a checkable statement about a good answer and its weight."""

    text: str
    weight: float


@dataclass(frozen=True)
class Rubric:
    """A validated rubric; build it with `parse_rubric` (from a model's text) or `Rubric.from_dict`."""

    criteria: tuple[Criterion, ...]

    @classmethod
    def from_dict(cls, data: Any, rules: RubricRules = DEFAULT_RULES) -> Rubric:
        """The rubric in a decoded JSON value, checked against `rules`; a `RubricError` says what is wrong.

        Keys other than `criteria` (and, in a criterion, other than `criterion` and `weight`) are ignored.
        """
        if not isinstance(data, dict):
            raise RubricError(
                f"The rubric must be a JSON object with a `criteria` list, got a JSON {_json_type(data)}."
            )
        if "criteria" not in data:
            raise RubricError(f"The rubric has no `criteria` (its keys: {sorted(data)}); put the criteria there.")
        entries = data["criteria"]
        if not isinstance(entries, list):
            raise RubricError(f"`criteria` must be a list, got a JSON {_json_type(entries)}.")
        if len(entries) < rules.min_criteria:
            raise RubricError(
                f"The rubric has {len(entries)} {'criterion' if len(entries) == 1 else 'criteria'}; at least "
                f"{rules.min_criteria} are required (`RubricRules.min_criteria`)."
            )
        criteria = tuple(_criterion(number, entry) for number, entry in enumerate(entries, start=1))
        total = sum(criterion.weight for criterion in criteria)
        # The slack keeps decimal weights that sum to exactly 1 ± tolerance valid despite float rounding (0.5 + 0.35).
        if abs(total - 1) > rules.weight_tolerance + 1e-9:
            raise RubricError(
                f"The weights sum to {total:g}, not 1 ± {rules.weight_tolerance:g}; make them sum to 1 "
                "(`RubricRules.weight_tolerance`)."
            )
        return cls(criteria)

    def to_dict(self) -> dict[str, list[dict[str, Any]]]:
        return {"criteria": [{"criterion": c.text, "weight": c.weight} for c in self.criteria]}

    def to_json(self) -> str:
        """The rubric as the judge reads it: only the validated criteria, as JSON."""
        return json.dumps(self.to_dict(), ensure_ascii=False)


def parse_rubric(text: str, rules: RubricRules = DEFAULT_RULES) -> Rubric:
    """The rubric in a model's `text`, checked against `rules`; a `RubricError` says what is wrong.

    Accepted, after closed `<think>...</think>` blocks are removed:
    - the text is one JSON object (surrounding whitespace allowed);
    - the text has a fenced code block (` ```json ` or bare ` ``` `): the first one must hold exactly one JSON object;
    - otherwise, the first JSON object in the text that has a `criteria` key; prose and other objects around it are
      ignored.
    Nothing is repaired: a truncated or malformed object is an error (the authors' parser repairs JSON; a rubric the
    model could not finish is not one).

    Args:
        text (`str`):
            What the rubric generator wrote.
        rules (`RubricRules`, *optional*):
            What makes a rubric valid; defaults to the EVOLM authors' values.
    """
    return Rubric.from_dict(_json_object(text), rules)


def rubric_is_valid(text: str, rules: RubricRules = DEFAULT_RULES) -> bool:
    """Whether `parse_rubric(text, rules)` succeeds."""
    try:
        parse_rubric(text, rules)
    except RubricError:
        return False
    return True


def _json_object(text: str) -> Any:
    """The JSON value `parse_rubric` reads from `text` (see there for what is accepted)."""
    if not isinstance(text, str):
        raise RubricError(f"A rubric must be text, got {type(text).__name__}.")
    text = _THINK_BLOCK.sub("", text).strip()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    fenced = _FENCED_BLOCK.search(text)
    if fenced:
        try:
            return json.loads(fenced.group(1))
        except json.JSONDecodeError as error:
            raise RubricError(f"The fenced block is not JSON ({error}); write one JSON object in it.") from None
    decoder = json.JSONDecoder()
    first_error = None
    for start in (match.start() for match in re.finditer(r"\{", text)):
        try:
            value, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError as error:
            first_error = first_error or error
            continue
        if isinstance(value, dict) and "criteria" in value:
            return value
    reason = f" (the first unreadable object: {first_error})" if first_error else ""
    raise RubricError(
        f"The rubric is not JSON: no JSON object with `criteria` in {_preview(text)}{reason}; reply with one JSON "
        "object."
    )


def _criterion(number: int, entry: Any) -> Criterion:
    """Criterion `number` (counted from 1) of a rubric, checked."""
    if not isinstance(entry, dict):
        raise RubricError(
            f"Criterion {number} must be an object with `criterion` and `weight`, got a JSON {_json_type(entry)}."
        )
    text = entry.get("criterion")
    if not isinstance(text, str) or not text.strip():
        raise RubricError(f"Criterion {number} has no text: `criterion` must be a non-empty string, got {text!r}.")
    weight = entry.get("weight")
    # A JSON number only: `true` decodes to a Python bool and "0.5" is text, neither is a weight.
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
        raise RubricError(f"Criterion {number} has weight {weight!r}; a weight must be a positive JSON number.")
    if weight <= 0:
        raise RubricError(f"Criterion {number} has weight {weight!r}; a weight must be > 0.")
    return Criterion(text.strip(), float(weight))


def _json_type(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _preview(text: str, limit: int = 80) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")
