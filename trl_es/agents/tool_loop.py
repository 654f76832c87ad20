"""The multi-turn tool loop: GRPOTrainer's `_tool_call_loop`, written over public pieces and for many rollouts at once,
each of which may belong to another population member.

A rollout is one conversation: its prompt ids, the completion so far (the first turn, then tool results and later
turns) and the completion as messages (what reward functions read). While the last assistant turn of a rollout calls
tools, the loop runs them, appends their results as the chat template renders them, and asks `generate` for the next
turn of every such rollout together, which is where the caller puts each rollout on its member's weights. As in GRPO:

- `max_completion_length` bounds the whole completion (every turn and every tool result together); a rollout whose
  tool results would pass it, or the model's context, stops at the tool-calling turn (the tools did run, and count);
- at most `max_iterations` rounds of tool calls run (a call in the turn after the last round is left unanswered);
- `tool_mask` is 1 on the model's own tokens and 0 on tool results and template glue.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from .tool_calls import ToolCounts, run_tool_calls
from .turns import ToolSuffix, parse_turn

# `generate(rollout indices, prompt ids, round)` -> one generated turn per index (token ids up to the first EOS).
GenerateTurn = Callable[[list[int], list[list[int]], int], list[list[int]]]


@dataclass
class ToolRollout:
    """One conversation continued with tools.

    Args:
        prompt_ids (`list[int]`): The prompt's token ids.
        completion_ids (`list[int]`): The first generated turn; the loop extends it.
        messages (`list[dict]`): The completion as messages, starting with the first turn's assistant message.
        tools (`Mapping[str, Callable]`): This rollout's tools by name (its environment's bound methods among them).
        schemas (`Sequence[Callable]`, *optional*): The tools its prompt was rendered with, which type the arguments
            of its calls when they are parsed.
        seed (`int`, *optional*): Seeds the global generators around each tool call (see `run_tool_calls`): the same
            for every member's rollout of one row, so their environments draw alike.
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    messages: list[dict]
    tools: Mapping[str, Callable]
    schemas: Sequence[Callable] | None = None
    seed: int | None = None
    tool_mask: list[int] = field(default=None)

    def __post_init__(self):
        if self.tool_mask is None:
            self.tool_mask = [1] * len(self.completion_ids)

    @property
    def pending_calls(self) -> list[dict]:
        """The tool calls of the last assistant turn (none once a turn answers without them)."""
        last = self.messages[-1] if self.messages else {}
        return (last.get("tool_calls") or []) if last.get("role") == "assistant" else []


@dataclass
class ToolLoop:
    """The settings of the loop (GRPO's): the tokenizer that parses turns, how tool results are rendered, the budget.

    Args:
        tokenizer: Parses generated turns (`response_template`; GRPO adds one for the templates it knows).
        suffix ([`ToolSuffix`]): The ids of tool results and the next turn's header.
        max_completion_length (`int`): Tokens of a whole completion, every turn and tool result together.
        context_length (`int`, *optional*): The model's context: prompt and completion together stay below it.
        max_iterations (`int`, *optional*): Rounds of tool calls (`max_tool_calling_iterations`; None: no limit).
        run_coroutines (`Callable`, *optional*): Runs async tools' coroutines (GRPO's event loop).
    """

    tokenizer: object
    suffix: ToolSuffix
    max_completion_length: int
    context_length: int | None = None
    max_iterations: int | None = None
    run_coroutines: Callable[[list], list] | None = None

    def run(self, rollouts: Sequence[ToolRollout], generate: GenerateTurn) -> ToolCounts:
        """Continue every rollout whose last turn calls tools until none does (or the budget ends it); returns the
        calls made and failed."""
        counts = ToolCounts()
        active = [index for index, rollout in enumerate(rollouts) if rollout.pending_calls]
        round_number = 0
        while active and (self.max_iterations is None or round_number < self.max_iterations):
            round_number += 1
            continued, contexts = [], []
            for index in active:
                context = self._answer_calls(rollouts[index], counts, round_number)
                if context is not None:
                    continued.append(index)
                    contexts.append(context)
            if not continued:
                break
            turns = generate(continued, contexts, round_number)
            active = []
            for index, context, turn in zip(continued, contexts, turns, strict=True):
                if self._append_turn(rollouts[index], context, turn):
                    active.append(index)
        return counts

    def _answer_calls(self, rollout: ToolRollout, counts: ToolCounts, round_number: int) -> list[int] | None:
        """Run the rollout's pending calls; returns the context to generate its next turn from, or None when the
        results do not fit (the rollout then ends at its tool-calling turn, without them)."""
        seed = None if rollout.seed is None else rollout.seed + round_number
        results = run_tool_calls(rollout.pending_calls, rollout.tools, counts, self.run_coroutines, seed)
        context = rollout.prompt_ids + rollout.completion_ids + self.suffix(results)
        over_budget = len(context) - len(rollout.prompt_ids) > self.max_completion_length
        if over_budget or (self.context_length is not None and len(context) >= self.context_length):
            return None
        rollout.messages.extend(results)
        return context

    def _append_turn(self, rollout: ToolRollout, context: list[int], turn: list[int]) -> bool:
        """Add a generated turn (cut to the budget); returns whether it calls tools again."""
        room = self.max_completion_length - (len(context) - len(rollout.prompt_ids))
        turn = turn[: max(room, 0)]
        glue = len(context) - len(rollout.prompt_ids) - len(rollout.completion_ids)
        rollout.tool_mask += [0] * glue + [1] * len(turn)
        rollout.completion_ids = context[len(rollout.prompt_ids) :] + turn
        if not turn:  # the budget left no room for the turn
            return False
        message = parse_turn(self.tokenizer, turn, context, rollout.schemas)
        rollout.messages.append(message)
        return bool(message.get("tool_calls"))
