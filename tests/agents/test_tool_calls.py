"""Running a turn's tool calls (`trl_es.agents.tool_calls`): GRPO's order, counts and error messages, async tools,
and the seeded global generators that give every member the same random outcome."""

import random

import torch

from trl_es.agents.tool_calls import ToolCounts, run_tool_calls


def call(name, **arguments):
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def double(x: int) -> int:
    return 2 * x


async def async_triple(x: int) -> int:
    return 3 * x


def draw() -> float:
    return random.random() + torch.rand(()).item()


def test_sync_results_come_first_then_async_ones_and_failures_are_counted():
    counts = ToolCounts()
    tools = {"double": double, "async_triple": async_triple}
    calls = [call("async_triple", x=2), call("double", x=5), call("missing"), {"type": "code", "name": "x"}]
    messages = run_tool_calls(calls, tools, counts)
    assert [m["content"] for m in messages] == [
        "10",
        "{'error': 'Tool missing not found.'}",
        "{'error': 'Unsupported tool call type: code'}",
        "6",
    ]
    assert [m["name"] for m in messages] == ["double", "missing", "x", "async_triple"]
    assert (counts.calls, counts.failures) == (4, 2)


def test_an_async_tool_that_raises_is_a_failure_read_as_its_result():
    async def broken(x: int) -> int:
        raise RuntimeError("service down")

    counts = ToolCounts()
    messages = run_tool_calls([call("broken", x=1)], {"broken": broken}, counts)
    assert messages == [{"role": "tool", "name": "broken", "content": "{'error': 'service down'}"}]
    assert counts.failures == 1


def test_a_seeded_call_draws_the_same_numbers_for_every_member_and_leaves_the_generators_alone():
    random.seed(0)
    before = random.random()
    random.seed(0)
    first = run_tool_calls([call("draw")], {"draw": draw}, ToolCounts(), seed=42)
    second = run_tool_calls([call("draw")], {"draw": draw}, ToolCounts(), seed=42)
    other = run_tool_calls([call("draw")], {"draw": draw}, ToolCounts(), seed=43)
    assert first == second and first != other
    assert random.random() == before  # the caller's stream went on as if no tool had run
