"""An offline agent task: price questions that only a tool can answer, with an environment in TRL's contract.

A question names two items and asks for the price of one ("The lamp and the desk are for sale. What does the desk
cost?"). The prices are drawn when the environment is reset, from Python's global `random`, so no model can know them:
the model must call `lookup(item)` and submit what it returned with `answer(value)`. The episode succeeds when the
submitted value is the asked item's price (`get_reward`). The embedded agent demo model (`trl_es/demo/tools_model`,
trained by `python -m trl_es.demo.pretrain_tools`) sometimes looks up the asked item, sometimes the other one, and
sometimes answers a guess without looking anything up.

Questions are a pure function of (split, index). Each possible question belongs to one split (by a hash of its text),
so pretraining, training and held-out questions never coincide; they differ in the pairing of items and templates,
not in the items or the wording.
"""

from __future__ import annotations

import random
from typing import NamedTuple

from datasets import Dataset

SPLITS = ("pretrain", "train", "test")
# The share of all questions in each split (hash of the question text, so the partition needs no files).
SPLIT_SHARES = {"pretrain": 0.5, "train": 0.25, "test": 0.25}

ITEMS = (
    "lamp", "desk", "chair", "sofa", "rug", "clock", "vase", "mirror", "shelf", "bed", "fan", "kettle",
    "radio", "bike", "drum", "kite", "boat", "hat", "coat", "shoe", "bag", "cup", "pen", "book",
)  # fmt: skip
# Every question names two items, `first` and `second`, and asks for the price of one of them.
TEMPLATES = (
    "The {first} and the {second} are for sale. What does the {asked} cost?",
    "A shop has a {first} and a {second}. How much is the {asked}?",
    "Compare the {first} with the {second}. What is the price of the {asked}?",
    "Next to the {first} is a {second}. Find the price of the {asked}.",
)
MIN_PRICE, MAX_PRICE = 10, 99  # two digits each, so a price is always copied in as many tokens
ANSWERED = "ok"  # what `answer` returns


class Question(NamedTuple):
    text: str
    item: str  # the asked item
    other: str  # the other item the question names
    template: int  # index in TEMPLATES


def question(split: str, index: int) -> Question:
    """The `index`-th question of `split`: drawn from a generator seeded by (split, index) until one of this split's
    questions comes up."""
    if split not in SPLITS:
        raise ValueError(f"Unknown split {split!r}: use one of {SPLITS}.")
    rng = random.Random(f"lookup-{split}-{index}")
    while True:
        drawn = _draw(rng)
        if split_of(drawn.text) == split:
            return drawn


def _draw(rng: random.Random) -> Question:
    template = rng.randrange(len(TEMPLATES))
    first, second = rng.sample(ITEMS, 2)
    asked, other = (first, second) if rng.random() < 0.5 else (second, first)
    text = TEMPLATES[template].format(first=first, second=second, asked=asked)
    return Question(text, asked, other, template)


def split_of(text: str) -> str:
    """The split a question belongs to (a deterministic hash of its text)."""
    position = random.Random(f"lookup-split-{text}").random()
    for split, share in SPLIT_SHARES.items():
        if position < share:
            return split
        position -= share
    return SPLITS[-1]


def lookup_dataset(split: str = "train", size: int = 512, offset: int = 0) -> Dataset:
    """Conversational prompts (the question as a user message) with the asked `item`, the column
    `LookupEnvironment.reset` reads; for ESTrainer and GRPOTrainer with `environment_factory=LookupEnvironment`."""
    rows = [question(split, offset + i) for i in range(size)]
    return Dataset.from_dict(
        {"prompt": [[{"role": "user", "content": row.text}] for row in rows], "item": [row.item for row in rows]}
    )


class LookupEnvironment:
    """A price list drawn at every reset, and two tools: `lookup` reads it, `answer` submits the answer.

    TRL's environment contract: built without arguments, `reset(**row)` once per episode with the dataset row's
    columns, every public method but `reset` and `get_reward` a tool, `get_reward()` the episode's reward. The prices
    come from Python's global `random`, so seeding it before `reset` (as ESTrainer does, alike for every population
    member) fixes the episode.
    """

    def __init__(self):
        self.item: str | None = None
        self.prices: dict[str, int] = {}
        self.submitted: int | None = None

    def reset(self, item: str, **kwargs) -> None:
        """Start an episode about `item` (the dataset's column); the question is the row's prompt."""
        if item not in ITEMS:
            raise ValueError(f"item={item!r} is not an item of this task: use one of {ITEMS}.")
        self.item = item
        self.prices = {name: random.randint(MIN_PRICE, MAX_PRICE) for name in ITEMS}
        self.submitted = None

    def lookup(self, item: str) -> int:
        """Look up the price of an item.

        Args:
            item: The name of the item.
        """
        if item not in self.prices:
            raise ValueError(f"No item named {item!r}.")
        return self.prices[item]

    def answer(self, value: int) -> str:
        """Submit the final answer; only the first one counts.

        Args:
            value: The price asked for.
        """
        if self.submitted is not None:
            raise ValueError("Already answered.")
        self.submitted = int(str(value).strip())  # a whole number, also when the call's arguments were not typed
        return ANSWERED

    def get_reward(self) -> float:
        """1.0 when the submitted answer is the asked item's price, else 0.0 (also when nothing was submitted)."""
        return float(self.item is not None and self.submitted == self.prices[self.item])
