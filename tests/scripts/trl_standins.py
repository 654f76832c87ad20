"""Local stand-ins for the Hub resources of TRL's GRPOTrainer agent tests (`integration/test_trl_agent_tests.py`), so
that those tests run here with nothing downloaded.

- The causal LMs `trl-internal-testing/tiny-Qwen2ForCausalLM-2.5`, `tiny-Qwen3ForCausalLM` and
  `tiny-Qwen3MoeForCausalLM`: a tiny randomly initialised model of the named architecture with a tiny BPE tokenizer
  (`trl_es.testing.build_tiny_tokenizer`, trained so that TRL's tool texts take about as many tokens as with Qwen's)
  carrying the Hub model's chat template (TRL's copy, string-equal, so `add_response_schema` and
  `get_training_chat_template` recognise it: Qwen2.5's, or Qwen3's, which is not prefix-preserving and gets TRL's
  training template), `<|im_end|>` as EOS and `<|endoftext|>` as padding, both generation EOS ids, as the Qwen tiny
  models have them; 4096 positions.
- The reward model `trl-internal-testing/tiny-Qwen2ForSequenceClassification-2.5`: a tiny
  `Qwen2ForSequenceClassification` (one label) saved with the same tokenizer, passed by path as TRL passes the id.
- The `trl-internal-testing/zen` configs `standard_prompt_only` (a text `prompt`) and `conversational_prompt_only`
  (a one-message `prompt`): the rows TRL's script writes them with (17 train, 2 test), so a test that depends on
  the number of prompts sees the same.

`StandinHub` maps those ids to saved stand-ins, built on first use; `token_rows` turns the texts of TRL's fake
`generate` functions into padded id rows of the stand-in tokenizer (TRL hard-codes Qwen's ids).
"""

from __future__ import annotations

from pathlib import Path

import torch
from datasets import Dataset
from transformers import (
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2ForSequenceClassification,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)
from trl.chat_template_utils import qwen2_5_chat_template, qwen3_chat_template

from trl_es.testing import build_tiny_tokenizer

END_OF_TURN = "<|im_end|>"
PAD = "<|endoftext|>"
CONTEXT = 4096
VOCAB_SIZE = 512
# Qwen's tokenizers hold these as single (added, not special) tokens; parse_response reads them from decoded text.
QWEN_TOOL_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]

# What the BPE learns from besides the zen prompts: the chat and tool text these tests render and generate. A real
# tokenizer writes such text in few tokens; one that spells it out letter by letter makes TRL's tool call (26 Qwen
# tokens) 79 tokens long, and with its result it no longer fits TRL's `max_completion_length=128`: the turn after the
# tool would never be generated. Trained on this, the call is 26 tokens again and its result's suffix 14.
_MULTIPLY_TOOL_SCHEMA = {
    "type": "function",
    "function": {
        "name": "multiply_tool",
        "description": "Multiplies two integers.",
        "parameters": {
            "type": "object",
            "properties": {
                "a": {"type": "integer", "description": "The first integer."},
                "b": {"type": "integer", "description": "The second integer."},
            },
            "required": ["a", "b"],
        },
        "return": {"type": "integer", "description": "The product of the two integers."},
    },
}
_TOOL_CONVERSATION = [
    {"role": "user", "content": "What is better than ugly?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "multiply_tool", "arguments": {"a": 3, "b": 4}}}],
    },
    {"role": "tool", "name": "multiply_tool", "content": "12"},
    {"role": "assistant", "content": "Done!"},
]
_AGENT_TEXTS = [
    '<tool_call>\n{"name": "multiply_tool", "arguments": {"a": 3, "b": 4}}\n</tool_call><|im_end|>',
    '<tool_call>\n{"name": "async_multiply_tool", "arguments": {"a": 3, "c": 4}}\n</tool_call><|im_end|>',
    '<tool_call>\n{"name": "increment", "arguments": {"step": 1}}\n</tool_call><|im_end|>',
    '<tool_call>\n{"name": "decrement", "arguments": {"step": 2}}\n</tool_call><|im_end|>',
    '<tool_call>\n{"name": "shout", "arguments": {"text": "hi"}}\n</tool_call><|im_end|>',
    "I don't know any tool<|im_end|>",
    "I won't increment<|im_end|>",
    "Done!<|im_end|> DoneDoneDone!<|im_end|>",
    "{'error': \"multiply_tool() got an unexpected keyword argument 'c'\"} Tool decrement not found.",
]

QWEN2_5 = "trl-internal-testing/tiny-Qwen2ForCausalLM-2.5"
QWEN3 = "trl-internal-testing/tiny-Qwen3ForCausalLM"
QWEN3_MOE = "trl-internal-testing/tiny-Qwen3MoeForCausalLM"
REWARD_MODEL = "trl-internal-testing/tiny-Qwen2ForSequenceClassification-2.5"

# The Hub model's architecture and chat template (TRL's tests of its chat-template helpers use the Qwen3 models as
# "qwen3", the Qwen2.5 one as "qwen2.5").
CAUSAL_LMS = {
    QWEN2_5: (Qwen2Config, Qwen2ForCausalLM, qwen2_5_chat_template),
    QWEN3: (Qwen3Config, Qwen3ForCausalLM, qwen3_chat_template),
    QWEN3_MOE: (Qwen3MoeConfig, Qwen3MoeForCausalLM, qwen3_chat_template),
}

# The zen datasets' prompts, as TRL's scripts/generate_zen_dataset.py writes them (PEP 20, one row per aphorism):
# a sentence to complete, or a question about it. The script splits them 17 / 2 (test_size=0.1, no shuffle).
ZEN_STANDARD = [
    "Beautiful is better than",
    "Explicit is",
    "Simple is better",
    "Complex",
    "Flat is better than",
    "Sparse is better",
    "Readability",
    "Special cases aren't special",
    "Although practicality beats",
    "Errors should never",
    "Unless explicitly",
    "In the face of ambiguity, refuse",
    "There should be one-- and preferably",
    "Although that way may not be obvious at first unless you're",
    "Now is",
    "Although never is often",
    "If the implementation is hard to explain,",
    "If the implementation is easy",
    "Namespaces are one honking great",
]
ZEN_CONVERSATIONAL = [
    "What is better than ugly?",
    "What is better than implicit?",
    "What is better than complex?",
    "What is better than complicated?",
    "What is better than nested?",
    "What is better than dense?",
    "What counts?",
    "Are special cases enough to break the rules?",
    "What beats purity?",
    "What should never pass silently?",
    "When can errors pass silently?",
    "What should you do in the face of ambiguity?",
    "How many ways should there be to do it?",
    "For whom may the way not be obvious at first?",
    "What is better than never?",
    "Is never better than *right* now?",
    "What does it mean if the implementation is hard to explain?",
    "What does it mean if the implementation is easy to explain?",
    "Any great ideas?",
]
ZEN_TRAIN_ROWS = 17


def build_standin_tokenizer(chat_template: str = qwen2_5_chat_template) -> PreTrainedTokenizerFast:
    """A tiny byte-level BPE (`trl_es.testing.build_tiny_tokenizer`, 512 tokens, trained on the zen prompts and the
    agent text above) with Qwen's tool tokens, a Qwen chat template, EOS `<|im_end|>` (the end of every turn, which
    GRPO's tool loop aligns on) and padding `<|endoftext|>`."""
    renderer = build_tiny_tokenizer(chat_template=False)
    rendered = [
        renderer.apply_chat_template(_TOOL_CONVERSATION, tools=tools, chat_template=template, tokenize=False)
        for template in (qwen2_5_chat_template, qwen3_chat_template)
        for tools in ([_MULTIPLY_TOOL_SCHEMA], None)
    ]
    tokenizer = build_tiny_tokenizer(
        VOCAB_SIZE, chat_template=False, corpus=(ZEN_STANDARD + ZEN_CONVERSATIONAL + rendered + _AGENT_TEXTS) * 2
    )
    tokenizer.add_tokens(QWEN_TOOL_TOKENS)
    tokenizer.chat_template = chat_template
    tokenizer.eos_token = END_OF_TURN
    tokenizer.pad_token = PAD
    return tokenizer


def _config(config_class, tokenizer: PreTrainedTokenizerFast, **extra):
    end_ids = [tokenizer.eos_token_id, tokenizer.pad_token_id]
    return config_class(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=CONTEXT,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=end_ids,
        pad_token_id=tokenizer.pad_token_id,
        **extra,
    )


def build_standin_causal_lm(hub_id: str, tokenizer: PreTrainedTokenizerFast, seed: int = 0):
    """A randomly initialised tiny model of `hub_id`'s architecture for `tokenizer`, whose generation stops at
    `<|im_end|>` or `<|endoftext|>` (Qwen's generation config)."""
    config_class, model_class, _ = CAUSAL_LMS[hub_id]
    extra = (
        dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32) if config_class is Qwen3MoeConfig else {}
    )
    torch.manual_seed(seed)
    model = model_class(_config(config_class, tokenizer, **extra))
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, tokenizer.pad_token_id]
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = None
    return model


def save_standin_causal_lm(hub_id: str, path: str | Path, seed: int = 0) -> Path:
    """Save `hub_id`'s stand-in (model and tokenizer) to `path`; returns the path."""
    path = Path(path)
    tokenizer = build_standin_tokenizer(CAUSAL_LMS[hub_id][2])
    build_standin_causal_lm(hub_id, tokenizer, seed).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def save_standin_reward_model(path: str | Path, seed: int = 1) -> Path:
    """Save the stand-in of `tiny-Qwen2ForSequenceClassification-2.5` (one label) with its tokenizer to `path`."""
    path = Path(path)
    tokenizer = build_standin_tokenizer(qwen2_5_chat_template)
    torch.manual_seed(seed)
    Qwen2ForSequenceClassification(_config(Qwen2Config, tokenizer, num_labels=1)).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


class StandinHub:
    """The stand-ins by Hub id, saved under `root` the first time a test asks for one: `hub[QWEN3_MOE]` is a path
    that `from_pretrained` (and so a trainer's `model=` or `reward_funcs=`) loads as it would load the id."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.paths: dict[str, str] = {}

    def __getitem__(self, hub_id: str) -> str:
        if hub_id not in self.paths:
            path = self.root / hub_id.split("/")[-1]
            if hub_id == REWARD_MODEL:
                save_standin_reward_model(path)
            else:
                save_standin_causal_lm(hub_id, path)
            self.paths[hub_id] = str(path)
        return self.paths[hub_id]


def load_zen(config: str, split: str = "train") -> Dataset:
    """The stand-in of `load_dataset("trl-internal-testing/zen", config, split=split)`: the same rows and columns."""
    if config == "standard_prompt_only":
        rows = {"prompt": list(ZEN_STANDARD)}
    elif config == "conversational_prompt_only":
        rows = {"prompt": [[{"role": "user", "content": text}] for text in ZEN_CONVERSATIONAL]}
    else:
        raise ValueError(f"No zen stand-in for config {config!r}: standard_prompt_only or conversational_prompt_only.")
    if split not in ("train", "test"):
        raise ValueError(f"The zen datasets have the splits 'train' and 'test', not {split!r}.")
    window = slice(None, ZEN_TRAIN_ROWS) if split == "train" else slice(ZEN_TRAIN_ROWS, None)
    return Dataset.from_dict({column: values[window] for column, values in rows.items()})


def token_rows(tokenizer: PreTrainedTokenizerFast, texts: list[str], device=None) -> torch.Tensor:
    """The completions `texts` as a `(len(texts), width)` tensor of `tokenizer`'s ids, right-padded with the pad id:
    what TRL's fake `generate` functions append to the prompt, with the stand-in's ids instead of Qwen's."""
    rows = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    width = max(len(row) for row in rows)
    padded = [row + [tokenizer.pad_token_id] * (width - len(row)) for row in rows]
    return torch.tensor(padded, dtype=torch.long, device=device)


def ordinary_token_ids(tokenizer: PreTrainedTokenizerFast, count: int) -> list[int]:
    """The first `count` ids that are no special token: stand-ins for arbitrary Qwen ids such as TRL's `1, 2, ...`
    (the tiny tokenizer's ids 0-2 are its pad, `<|im_start|>` and EOS)."""
    special = set(tokenizer.all_special_ids)
    return [token for token in range(len(tokenizer)) if token not in special][:count]
