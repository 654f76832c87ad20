"""From prompts to token ids and from completion ids back to what reward functions read, as `GRPOTrainer` does it
(chat templates, `parse_response` for templates that declare a response format, completion-length metrics), written
out so that an ES step calls its backend directly."""

from __future__ import annotations

import torch
from trl.chat_template_utils import parse_response
from trl.data_utils import is_conversational

from .reward_checks import short_repr


def tokenizer_of(processing_class):
    """The tokenizer of a tokenizer or of a processor (vision-language models)."""
    return getattr(processing_class, "tokenizer", processing_class)


def tokenize_prompts(
    processing_class,
    prompts: list,
    chat_template: str | None = None,
    chat_template_kwargs: dict | None = None,
    tools: list[list] | None = None,
) -> list[list[int]]:
    """Token ids of each prompt: conversations through the chat template with the generation prompt (and the schemas
    of `tools[i]`, the tools of prompt `i`), plain text through the tokenizer. An empty prompt or conversation is
    refused by index (it has nothing to continue)."""
    empty = [index for index, prompt in enumerate(prompts) if prompt is None or len(prompt) == 0]
    if empty:
        raise ValueError(
            f"Prompts {empty[:10]} of this batch are empty ({prompts[empty[0]]!r}): every prompt needs text, or a "
            "conversation with at least one message. Filter them out, e.g. "
            "`dataset = dataset.filter(lambda row: len(row['prompt']) > 0)`."
        )
    if not is_conversational({"prompt": prompts[0]}):
        return [list(ids) for ids in processing_class(text=prompts)["input_ids"]]
    if tools is not None and any(row_tools != tools[0] for row_tools in tools):  # each with its environment's tools
        return [
            _render(processing_class, [prompt], chat_template, chat_template_kwargs, row_tools)[0]
            for prompt, row_tools in zip(prompts, tools, strict=True)
        ]
    return _render(processing_class, prompts, chat_template, chat_template_kwargs, tools[0] if tools else None)


def _render(processing_class, prompts, chat_template, chat_template_kwargs, tools) -> list[list[int]]:
    tokenized = processing_class.apply_chat_template(
        conversation=prompts,
        tools=tools or None,  # not []: some templates (Llama) render tool boilerplate for an empty list
        chat_template=chat_template,
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
        **(chat_template_kwargs or {}),
    )
    return [list(ids) for ids in tokenized["input_ids"]]


def context_length(model, args) -> int | None:
    """The longest prompt plus completion the generation backend holds: `vllm_max_model_length` when vLLM generates
    with one set, else the model's positions (`max_position_embeddings`, of the text model for a VLM); None when the
    model does not say."""
    if args.use_vllm and args.vllm_max_model_length:
        return args.vllm_max_model_length
    config = getattr(model.config, "text_config", None) or model.config
    return getattr(config, "max_position_embeddings", None)


def check_prompts_fit(
    prompts: list, prompt_ids: list[list[int]], max_completion_length: int, context: int | None
) -> None:
    """Refuse prompts that leave no room for a whole completion in the model's `context` (issue 27: they ran
    silently, their completions cut by the positions instead of `max_completion_length`, or generated past the
    positions the model was trained on)."""
    if context is None:
        return
    longest = context - max_completion_length
    too_long = [index for index, ids in enumerate(prompt_ids) if len(ids) > longest]
    if too_long:
        first = too_long[0]
        count = len(prompt_ids[first])
        raise ValueError(
            f"Prompt {first} of this batch ({short_repr(prompts[first])}) is {count} tokens long ({len(too_long)} "
            f"prompts of the batch are too long): with max_completion_length={max_completion_length}, the model's "
            f"context of {context} tokens holds prompts of at most {longest} tokens. Filter the dataset, e.g. "
            "`dataset = dataset.filter(lambda row: len(tokenizer.apply_chat_template(row['prompt'], "
            f"add_generation_prompt=True)['input_ids']) <= {longest})` (`len(tokenizer(row['prompt']).input_ids)` "
            "for text prompts), or lower max_completion_length."
        )


def decode_completions(
    processing_class,
    prompts: list,
    prompt_ids: list[list[int]],
    completion_ids: list[list[int]],
    tools: list[list] | None = None,
) -> list:
    """What reward functions receive as `completions`: text for text prompts, an assistant message for
    conversations (parsed by the tokenizer's response format where it declares one, the arguments of its tool calls
    typed by `tools[i]`, the tools of prompt `i`)."""
    tokenizer = tokenizer_of(processing_class)
    if not is_conversational({"prompt": prompts[0]}):
        return processing_class.batch_decode(completion_ids, skip_special_tokens=True)
    if getattr(tokenizer, "response_template", None) is not None or getattr(tokenizer, "response_schema", None):
        tools = tools or [None] * len(prompts)
        return [
            [parse_response(tokenizer, ids, prefix=prompt_ids[i], tools=tools[i] or None)]
            for i, ids in enumerate(completion_ids)
        ]
    contents = processing_class.batch_decode(completion_ids, skip_special_tokens=True)
    return [[{"role": "assistant", "content": content}] for content in contents]


def truncation_mask(completion_ids: list[list[list[int]]], tokens) -> torch.Tensor:
    """`(members, rows)`: whether each completion ended without an end token (EOS or padding), as GRPO's
    `mask_truncated_completions` and `completions/clipped_ratio` judge it (the last token of every turn together)."""
    return torch.tensor([[not ids or ids[-1] not in tokens.end_ids for ids in member] for member in completion_ids])


def completion_metrics(lengths: torch.Tensor, truncated: torch.Tensor) -> dict[str, float]:
    """GRPO's `completions/*` metrics from every completion's length and whether it ended without EOS."""
    lengths = lengths.float()
    terminated = lengths[~truncated]
    if len(terminated) == 0:  # as GRPO: no completion ended with EOS
        terminated = torch.zeros(1)
    return {
        "completions/mean_length": lengths.mean().item(),
        "completions/min_length": lengths.min().item(),
        "completions/max_length": lengths.max().item(),
        "completions/clipped_ratio": truncated.float().mean().item(),
        "completions/mean_terminated_length": terminated.mean().item(),
        "completions/min_terminated_length": terminated.min().item(),
        "completions/max_terminated_length": terminated.max().item(),
    }
