"""Running an assistant turn's tool calls, as GRPOTrainer does: each call by name among the rollout's tools, sync
tools at once and async ones together on the trainer's event loop; an unknown tool, a wrong argument or an exception
is a failure whose message the model reads as the tool's result."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..core.noise import derive_seed
from .common_random import seeded_globals


@dataclass
class ToolCounts:
    """Tool calls made and failed: GRPO logs `tools/call_frequency` (calls per rollout) and `tools/failure_frequency`
    (failures per call)."""

    calls: int = 0
    failures: int = 0

    def __iadd__(self, other: ToolCounts) -> ToolCounts:
        self.calls += other.calls
        self.failures += other.failures
        return self


def run_tool_calls(
    tool_calls: list[dict],
    tools: Mapping[str, Callable],
    counts: ToolCounts,
    run_coroutines: Callable[[list], list] | None = None,
    seed: int | None = None,
) -> list[dict]:
    """The tool messages (`{"role": "tool", "name": ..., "content": ...}`) answering `tool_calls`, sync results first
    and async ones after them, as GRPO orders them; `counts` counts every call and every failure.

    Args:
        tool_calls (`list[dict]`): The turn's calls, `{"type": "function", "function": {"name", "arguments"}}`.
        tools (`Mapping[str, Callable]`): The rollout's tools by name (an environment's bound methods among them).
        counts ([`ToolCounts`]): Updated in place.
        run_coroutines (`Callable`, *optional*): Runs a list of coroutines to completion and returns their results or
            exceptions (GRPO's daemon event loop); needed only when a tool is async.
        seed (`int`, *optional*): Each call runs with the global generators seeded from `(seed, call index)`, so that
            members making the same calls meet the same random outcomes.
    """
    results, pending = [], []
    for index, call in enumerate(tool_calls):
        counts.calls += 1
        if call.get("type") != "function":
            counts.failures += 1
            results.append((call.get("name", "unknown"), {"error": f"Unsupported tool call type: {call.get('type')}"}))
            continue
        name, arguments = call["function"]["name"], call["function"].get("arguments") or {}
        try:
            tool = tools.get(name)
            if tool is None:
                raise ValueError(f"Tool {name} not found.")
            with seeded_globals(None if seed is None else derive_seed(seed, index)):
                result = tool(**arguments)
            if inspect.isawaitable(result):
                pending.append((name, result))
            else:
                results.append((name, result))
        except Exception as error:  # the model reads the failure as the tool's answer
            counts.failures += 1
            results.append((name, {"error": str(error)}))
    if pending:
        outcomes = (run_coroutines or _run_here)([coroutine for _, coroutine in pending])
        for (name, _), outcome in zip(pending, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                counts.failures += 1
                outcome = {"error": str(outcome)}
            results.append((name, outcome))
    return [{"role": "tool", "name": name, "content": _content(result)} for name, result in results]


def _content(result) -> str | list:
    """A list result is multimodal content blocks, kept as they are; anything else is its text."""
    return result if isinstance(result, list) else str(result)


def _run_here(coroutines: list) -> list:
    async def gather():
        return await asyncio.gather(*coroutines, return_exceptions=True)

    return asyncio.run(gather())
