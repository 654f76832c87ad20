"""Running a judge: many scores at once from any thread, inside a running event loop or not (`score_all`), and the
startup check that fails loudly, showing what the judge answered (`probe_judge`)."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Sequence

from .base import PARSE_FAILURE, RAW_SHOWN, Judge, JudgeError

_background: tuple[int, asyncio.AbstractEventLoop] | None = None  # (process id, loop)
_background_lock = threading.Lock()


def _background_loop() -> asyncio.AbstractEventLoop:
    """The event loop, on a daemon thread of its own, on which `score_all` runs judges (one per process)."""
    global _background
    with _background_lock:
        # A forked child inherits the loop object but not its thread: it starts its own.
        if _background is None or _background[0] != os.getpid():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="trl-es-judge-loop", daemon=True).start()
            _background = (os.getpid(), loop)
        return _background[1]


def running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def score_all(judge: Judge, items: Sequence[tuple[str, str, str]]) -> list[float | None]:
    """Scores every `(question, rubric, response)` item with `judge`, all concurrently; returns the scores in order.

    The coroutines run on a private event loop in a background thread, so this blocking call works from plain code and
    from code already inside a running event loop (a notebook, an async trainer). An exception raised by the judge
    (a bug, as failures are `None`) propagates.
    """
    items = list(items)
    if not items:
        return []
    loop = _background_loop()
    if running_loop() is loop:
        raise JudgeError("score_all was called from inside a judge's coroutine; `await judge.score(...)` instead.")
    future = asyncio.run_coroutine_threadsafe(_gather_scores(judge, items), loop)
    try:
        return future.result()
    except BaseException:
        future.cancel()  # an interrupted caller leaves no requests running behind it
        raise


async def _gather_scores(judge: Judge, items: list[tuple[str, str, str]]) -> list[float | None]:
    return list(await asyncio.gather(*(judge.score(*item) for item in items)))


PROBE_QUESTION = "What is 2 + 3?"
PROBE_RUBRIC = '{"criteria": [{"criterion": "The answer states that 2 + 3 = 5.", "weight": 1.0}]}'
PROBE_RESPONSE = "2 + 3 = 5."


def probe_judge(
    judge: Judge, question: str = PROBE_QUESTION, rubric: str = PROBE_RUBRIC, response: str = PROBE_RESPONSE
) -> float:
    """Scores one known item and returns the score; a judge that fails raises a [`JudgeError`] showing its answer.

    Run it once at start: a server that is down, a wrong model name or a judge that does not answer in the judge
    prompt's JSON then stops the run at once, instead of turning every reward into `None`.
    """
    [score] = score_all(judge, [(question, rubric, response)])
    if score is not None:
        return score
    reason = getattr(judge, "last_error", None) or PARSE_FAILURE
    message = f"The judge {judge!r} failed its startup probe: {reason}."
    if reason == PARSE_FAILURE:
        raw = getattr(judge, "last_raw", None)
        shown = "nothing" if raw is None else repr(raw[:RAW_SHOWN]) + ("..." if len(raw) > RAW_SHOWN else "")
        message += (
            f" It returned {shown}. A judge must reply with JSON "
            '{"reasoning": ..., "score": <number from 0 to 1>}: use an instruction-tuned judge model (e.g. '
            "Qwen/Qwen3-1.7B), enough max tokens for its answer, or a judge template that asks for this format."
        )
    raise JudgeError(message)
