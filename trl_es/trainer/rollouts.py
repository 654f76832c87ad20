"""From prompts to token ids and from completion ids back to what reward functions read, as `GRPOTrainer` does it
(chat templates, `parse_response` for templates that declare a response format, completion-length metrics), written
out so that an ES step calls its backend directly."""

from __future__ import annotations

import torch
from trl.chat_template_utils import parse_response
from trl.data_utils import is_conversational


def check_prompt_column(dataset, name: str) -> None:
    """Refuse a dataset (or dict of datasets) without a `prompt` column, which every ES step reads."""
    if isinstance(dataset, dict):
        for key, split in dataset.items():
            check_prompt_column(split, f"{name}[{key!r}]")
        return
    columns = getattr(dataset, "column_names", None)  # None for an iterable dataset whose features are unknown
    if columns is not None and "prompt" not in columns:
        raise ValueError(
            f"{name} has no 'prompt' column (its columns: {columns}). ESTrainer, like GRPOTrainer, reads each "
            "example's prompt from it: rename the column holding the prompts, e.g. "
            "`dataset = dataset.rename_column('question', 'prompt')`."
        )


def check_prompts_fill_a_step(dataset, args) -> None:
    """Refuse a train dataset with fewer prompts than one ES step uses: GRPO's sampler drops an incomplete batch, so
    training would end at step 0 without a single update."""
    prompts_per_step = args.generation_batch_size // args.num_generations
    if dataset is not None and hasattr(dataset, "__len__") and 0 < len(dataset) < prompts_per_step:
        raise ValueError(
            f"train_dataset has {len(dataset)} prompts, fewer than the {prompts_per_step} prompts of one ES step "
            f"(per_device_train_batch_size={args.per_device_train_batch_size} x gradient_accumulation_steps="
            f"{args.gradient_accumulation_steps} x processes={args.world_size} / num_generations="
            f"{args.num_generations}), so training would stop at step 0 without an update. Lower "
            "per_device_train_batch_size to at most the number of prompts, or add prompts."
        )


def tokenizer_of(processing_class):
    """The tokenizer of a tokenizer or of a processor (vision-language models)."""
    return getattr(processing_class, "tokenizer", processing_class)


def tokenize_prompts(
    processing_class, prompts: list, chat_template: str | None = None, chat_template_kwargs: dict | None = None
) -> list[list[int]]:
    """Token ids of each prompt: conversations through the chat template with the generation prompt, plain text
    through the tokenizer."""
    if is_conversational({"prompt": prompts[0]}):
        tokenized = processing_class.apply_chat_template(
            conversation=prompts,
            chat_template=chat_template,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            **(chat_template_kwargs or {}),
        )
        return [list(ids) for ids in tokenized["input_ids"]]
    return [list(ids) for ids in processing_class(text=prompts)["input_ids"]]


def decode_completions(
    processing_class, prompts: list, prompt_ids: list[list[int]], completion_ids: list[list[int]]
) -> list:
    """What reward functions receive as `completions`: text for text prompts, an assistant message for
    conversations (parsed by the tokenizer's response format where it declares one)."""
    tokenizer = tokenizer_of(processing_class)
    if not is_conversational({"prompt": prompts[0]}):
        return processing_class.batch_decode(completion_ids, skip_special_tokens=True)
    if getattr(tokenizer, "response_template", None) is not None or getattr(tokenizer, "response_schema", None):
        return [[parse_response(tokenizer, ids, prefix=prompt_ids[i])] for i, ids in enumerate(completion_ids)]
    contents = processing_class.batch_decode(completion_ids, skip_special_tokens=True)
    return [[{"role": "assistant", "content": content}] for content in contents]


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
