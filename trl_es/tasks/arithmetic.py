"""An offline arithmetic task with a verifier: word problems over small whole numbers, answered with a number.

The embedded demo model (`trl_es/demo/model`, trained by `python -m trl_es.demo.pretrain`) learned a little
of this task; ES then trains it on the verifier's reward. Problems are a pure function of (split, index), so the
train and held-out sets never share a problem and need no files.
"""

from __future__ import annotations

import random
import re
from typing import NamedTuple

from datasets import Dataset

SPLITS = ("pretrain", "train", "test")
PROMPT_SUFFIX = "\nAnswer:"

_NAMES = ["Ann", "Ben", "Cleo", "Dan", "Eva", "Finn", "Gus", "Hana", "Ivy", "Jon", "Kim", "Leo", "Mia", "Nia", "Omar"]
_THINGS = ["apples", "books", "cards", "coins", "eggs", "marbles", "pens", "shells", "stamps", "stickers"]
_ADD = [
    "{name} has {a} {things} and gets {b} more. How many {things} does {name} have now?",
    "{name} buys {a} {things} and then {b} {things}. How many {things} did {name} buy?",
    "What is {a} plus {b}?",
]
_SUBTRACT = [
    "{name} has {a} {things} and gives away {b}. How many {things} are left?",
    "{name} had {a} {things} and lost {b} of them. How many {things} does {name} have now?",
    "What is {a} minus {b}?",
]
# Every question comes from one of these templates (additions first), so a solver's habits can depend on the template.
TEMPLATES = (*_ADD, *_SUBTRACT)
_TEMPLATE_PATTERNS = [
    re.compile("^" + re.sub(r"\\\{(\w+)\\\}", ".+?", re.escape(template)) + "$") for template in TEMPLATES
]
MAX_OPERAND = 10  # sums up to 20; subtraction from numbers up to 20
_HELD_OUT_SPLITS = ("train", "test")
_NUMBER = re.compile(r"-?\d+")


class Problem(NamedTuple):
    question: str
    answer: int
    misread_answer: int  # the answer of the other operation: what a solver who misreads the question writes


def problem(split: str, index: int) -> Problem:
    """The `index`-th problem of `split`.

    The pretraining split never repeats a question of the `train` or `test` splits' first 10,000 problems, so
    held-out accuracy measures generalisation to unseen questions, not memory.
    """
    if split not in SPLITS:
        raise ValueError(f"Unknown split {split!r}: use one of {SPLITS}.")
    while True:
        drawn = _draw(random.Random(f"{split}-{index}"))
        if split in _HELD_OUT_SPLITS or drawn.question not in _held_out_questions():
            return drawn
        index += 10_000_000  # skip a pretraining draw that collides with a held-out problem


def _draw(rng: random.Random) -> Problem:
    fields = {"name": rng.choice(_NAMES), "things": rng.choice(_THINGS)}
    if rng.random() < 0.5:
        a, b = rng.randrange(MAX_OPERAND + 1), rng.randrange(MAX_OPERAND + 1)
        return Problem(rng.choice(_ADD).format(a=a, b=b, **fields), a + b, abs(a - b))
    a = rng.randrange(2 * MAX_OPERAND + 1)
    b = rng.randrange(a + 1)  # differences stay non-negative
    return Problem(rng.choice(_SUBTRACT).format(a=a, b=b, **fields), a - b, a + b)


_HELD_OUT_CACHE: set[str] = set()


def _held_out_questions() -> set[str]:
    if not _HELD_OUT_CACHE:
        _HELD_OUT_CACHE.update(problem(split, i)[0] for split in _HELD_OUT_SPLITS for i in range(10_000))
    return _HELD_OUT_CACHE


def template_of(question: str) -> int:
    """The index in `TEMPLATES` of the template that wrote `question`."""
    for index, pattern in enumerate(_TEMPLATE_PATTERNS):
        if pattern.match(question):
            return index
    raise ValueError(f"{question!r} is not a question of this task: it matches none of its templates.")


def prompt_of(question: str) -> str:
    return f"Question: {question}{PROMPT_SUFFIX}"


def arithmetic_dataset(split: str = "train", size: int = 512, offset: int = 0) -> Dataset:
    """Plain-text prompts with an `answer` column (the number, as text), ready for ESTrainer and GRPOTrainer."""
    if size > 10_000 and split in _HELD_OUT_SPLITS:
        raise ValueError(f"size={size}: the {split!r} split has 10,000 problems. Use size <= 10000.")
    rows = [problem(split, offset + i) for i in range(size)]
    return Dataset.from_dict(
        {"prompt": [prompt_of(p.question) for p in rows], "answer": [str(p.answer) for p in rows]}
    )


def extract_answer(completion: str) -> str | None:
    """The first whole number in a completion, as text (`" 42 apples"` -> `"42"`); None if there is none."""
    match = _NUMBER.search(completion)
    return str(int(match.group())) if match else None


def arithmetic_reward(completions: list, answer: list[str], **kwargs) -> list[float]:
    """Reward function (GRPO signature): 1.0 when the first number of the completion is the answer, else 0.0."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [float(extract_answer(text) == str(int(target))) for text, target in zip(texts, answer, strict=True)]
