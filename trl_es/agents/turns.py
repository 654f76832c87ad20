"""From token ids to an assistant turn and back, as GRPOTrainer does it with TRL's public helpers: a generated turn
is parsed into a message (with its tool calls), and the ids that continue a conversation after tool results are the
chat template's own rendering of those results, appended without re-tokenizing what came before."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from trl.chat_template_utils import parse_response


def parse_turn(tokenizer, ids: list[int], prefix: list[int], tools: Sequence[Callable] | None = None) -> dict:
    """The assistant message of generated `ids` (after the context `prefix`): `{"role": "assistant", "content": ...}`
    with `"tool_calls"` when it calls tools (their arguments typed by the tools' signatures); a malformed call is
    plain text, as in GRPO."""
    return parse_response(tokenizer, ids, prefix=prefix, tools=list(tools) if tools else None)


class ToolSuffix:
    """The token ids that follow an assistant turn ending in tool calls: the tool results, as the chat template
    renders them, then the next assistant turn's header.

    As GRPOTrainer computes them (its `_get_tool_suffix_ids`): a one-call conversation is rendered without and with
    the tool messages; the difference, from the assistant turn's end-of-turn token on, is the suffix.

    Args:
        processing_class: The tokenizer (or processor) whose chat template renders the conversation.
        chat_template (`str`, *optional*): A template to use instead of the tokenizer's (GRPO's training template).
        chat_template_kwargs (`dict`, *optional*): Passed to `apply_chat_template`.
    """

    def __init__(self, processing_class, chat_template: str | None = None, chat_template_kwargs: dict | None = None):
        self.processing_class = processing_class
        self.chat_template = chat_template
        self.chat_template_kwargs = chat_template_kwargs or {}
        self.eos_token_id = getattr(processing_class, "tokenizer", processing_class).eos_token_id

    def __call__(self, tool_messages: list[dict]) -> list[int]:
        # The real tool name: some templates (GPT-OSS) derive the tool response header from the call's name.
        call = {"type": "function", "function": {"name": tool_messages[0]["name"], "arguments": {}}}
        conversation = [
            {"role": "user", "content": "dummy"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
        ]
        prefix = self._render(conversation, add_generation_prompt=False)
        full = self._render(conversation + tool_messages, add_generation_prompt=True)
        # Templates that write "<end of turn>\n" after a turn: the model generated the end-of-turn token, not the
        # newline, so the suffix starts right after the end-of-turn token.
        ends = [position for position, token in enumerate(prefix) if token == self.eos_token_id]
        if ends:
            prefix = prefix[: ends[-1] + 1]
        if full[: len(prefix)] != prefix:
            raise ValueError(
                "The chat template does not render a conversation with tool results as its rendering without them "
                "plus more tokens, so the tokens after a tool call cannot be appended to the generated ones. Use a "
                "prefix-preserving chat template (see trl.chat_template_utils.get_training_chat_template)."
            )
        return full[len(prefix) :]

    def _render(self, conversation: list[dict], add_generation_prompt: bool) -> list[int]:
        return list(
            self.processing_class.apply_chat_template(
                conversation,
                add_generation_prompt=add_generation_prompt,
                tokenize=True,
                chat_template=self.chat_template,
                return_dict=False,
                **self.chat_template_kwargs,
            )
        )
