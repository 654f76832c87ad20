"""A panel of judges scoring as one: each item goes to every judge concurrently, and the panel's score is the mean or
the median of the scores of the judges that answered (a judge's failure leaves it out; all failing is a failure)."""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Sequence

from .base import Judge, JudgeError, JudgeStats

REDUCTIONS = ("mean", "median")


class JudgePanel:
    r"""
    Several judges as one [`Judge`]: a score is the `reduce` of the panel members' scores.

    A panel smooths one judge's quirks (a policy under RL finds the weak spots of a single judge); the median also
    resists one judge that a response has gamed. Members that fail on an item are left out of its score; when every
    member fails, the panel fails (`None`), as one judge would.

    Args:
        judges (`Sequence[Judge]`):
            The members, e.g. `OpenAIJudge` clients of different servers or models.
        reduce (`str`, *optional*, defaults to `"mean"`):
            `"mean"` or `"median"` of the members' scores.

    Attributes:
        stats ([`JudgeStats`]): the panel's own counts (`failures`: items no member scored).
        last_error (`str`): why the last failed item failed, member by member.
    """

    def __init__(self, judges: Sequence[Judge], reduce: str = "mean"):
        judges = list(judges)
        if not judges:
            raise JudgeError("A JudgePanel needs at least one judge, got none.")
        if reduce not in REDUCTIONS:
            raise JudgeError(f"reduce must be one of {REDUCTIONS}, got {reduce!r}.")
        self.judges, self.reduce = judges, reduce
        self.stats = JudgeStats()
        self.last_error: str | None = None

    def __repr__(self) -> str:
        return f"JudgePanel({self.judges!r}, reduce={self.reduce!r})"

    @property
    def last_raw(self) -> str | None:
        """The last answer of the first member that has one (what `probe_judge` shows)."""
        return next((raw for judge in self.judges if (raw := getattr(judge, "last_raw", None)) is not None), None)

    async def score(self, question: str, rubric: str, response: str) -> float | None:
        self.stats.requests += 1
        scores = await asyncio.gather(*(judge.score(question, rubric, response) for judge in self.judges))
        answered = [score for score in scores if score is not None]
        if not answered:
            self.stats.failures += 1
            self.last_error = "; ".join(
                f"{judge!r}: {getattr(judge, 'last_error', None) or 'no score'}" for judge in self.judges
            )
            return None
        return statistics.fmean(answered) if self.reduce == "mean" else statistics.median(answered)
