"""Train the embedded agent demo model from scratch: a small Qwen2 that calls the price tools, not always well.

    python -m trl_es.demo.pretrain_tools --output_dir trl_es/demo/tools_model

Supervised next-token training on transcripts of the `pretrain` split of `trl_es.tasks.lookup`, written in the
compact tool-calling chat template (`trl_es.testing.TOOL_CHAT_TEMPLATE`), with the loss on the assistant's turns only
(never on the tool results, whose prices are random). The transcripts come from a careless solver: on some question
templates it usually looks the price up, on others it usually answers a guess, and when it looks up it names the
other item of the question a third of the time; after a lookup it always submits the price it read. The model learns
these habits, and ES then makes it prefer the call that succeeds, through the environment's reward alone.
Deterministic: a fixed seed, one thread and a fixed number of steps give the same weights bit for bit with the same
torch build. The embedded model took 24 minutes on one CPU thread (3000 steps; the machine's other core was busy).
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from transformers.utils import get_json_schema

from ..agents.environments import environment_tools
from ..tasks.lookup import ANSWERED, ITEMS, MAX_PRICE, MIN_PRICE, LookupEnvironment, question
from ..testing import build_tiny_qwen2, build_tool_tokenizer
from .pretrain import masked_batch, save_model_and_tokenizer, train_supervised

# The careless solver's habits: the chance that it answers a guess instead of looking up, by question template,
# and the chance that a lookup names the question's other item.
GUESS_RATE = (0.3, 0.45, 0.6, 0.75)
WRONG_ITEM_RATE = 1 / 3
TOKENIZER_CORPUS_SIZE = 2000


def tool_schemas() -> list[dict]:
    """The JSON schemas of the environment's tools in the order a trainer lists them (by name: `answer`, `lookup`),
    as the chat template receives them; the model learns the prompt as it will see it."""
    return [get_json_schema(tool) for tool in environment_tools(LookupEnvironment())]


def _call(name: str, **arguments) -> dict:
    call = {"type": "function", "function": {"name": name, "arguments": arguments}}
    return {"role": "assistant", "content": "", "tool_calls": [call]}


def transcript(index: int) -> list[dict]:
    """The careless solver's conversation on pretraining question `index`: the question, its tool calls with their
    results, and its closing (empty) turn."""
    asked = question("pretrain", index)
    prices = random.Random(f"lookup-prices-{index}")
    price = {name: prices.randint(MIN_PRICE, MAX_PRICE) for name in ITEMS}
    habit = random.Random(f"lookup-solver-{index}")
    messages = [{"role": "user", "content": asked.text}]
    if habit.random() < GUESS_RATE[asked.template]:
        submitted = habit.randint(MIN_PRICE, MAX_PRICE)
    else:
        looked_up = asked.other if habit.random() < WRONG_ITEM_RATE else asked.item
        submitted = price[looked_up]
        messages += [_call("lookup", item=looked_up), {"role": "tool", "name": "lookup", "content": str(submitted)}]
    messages += [_call("answer", value=submitted), {"role": "tool", "name": "answer", "content": ANSWERED}]
    return messages + [{"role": "assistant", "content": ""}]


def tokenizer_corpus(size: int = TOKENIZER_CORPUS_SIZE) -> list[str]:
    """The texts the BPE is trained on: questions, the tools line, calls and role names (not the special tokens)."""
    corpus = [question("pretrain", index).text for index in range(size)]
    corpus += ["tools: answer(value), lookup(item)", "system\n", "user\n", "assistant\n", "tool\n", ANSWERED]
    corpus += [f"lookup item: {item}" for item in ITEMS] + [f"answer value: {value}" for value in range(100)]
    return corpus


def training_example(tokenizer, messages: list[dict], tools: list[dict]) -> tuple[list[int], list[int]]:
    """(token ids, loss mask) of a conversation: 1 on what the model writes in each assistant turn (its end-of-turn
    token included), 0 on the prompt, the tool results and the turn headers."""
    ids = tokenizer.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=False)
    header = _assistant_header(tokenizer)
    turn_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    mask, in_assistant_turn = [0] * len(ids), False
    for position, token in enumerate(ids):
        if token == turn_start:
            in_assistant_turn = ids[position : position + len(header)] == header
            start = position + len(header)
        elif in_assistant_turn and position >= start:
            mask[position] = 1
    return ids, mask


def _assistant_header(tokenizer) -> list[int]:
    user = [{"role": "user", "content": "x"}]
    with_header = tokenizer.apply_chat_template(user, add_generation_prompt=True, tokenize=True, return_dict=False)
    return with_header[len(tokenizer.apply_chat_template(user, tokenize=True, return_dict=False)) :]


def training_examples(tokenizer, size: int, seed: int) -> list[tuple[list[int], list[int]]]:
    tools = tool_schemas()
    examples = [training_example(tokenizer, transcript(index), tools) for index in range(size)]
    random.Random(seed).shuffle(examples)
    return examples


def pretrain_tools(
    output_dir: str | Path,
    max_steps: int = 3000,
    batch_size: int = 64,
    learning_rate: float = 3e-3,
    num_examples: int = 20_000,
    hidden_size: int = 128,
    num_hidden_layers: int = 4,
    seed: int = 0,
    log=print,
) -> Path:
    """Build the tokenizer and model, train them for `max_steps` and save both to `output_dir`."""
    tokenizer = build_tool_tokenizer(vocab_size=512, corpus=tokenizer_corpus(), individual_digits=True)
    model = build_tiny_qwen2(tokenizer, seed=seed, hidden_size=hidden_size, num_hidden_layers=num_hidden_layers)
    examples = training_examples(tokenizer, num_examples, seed)
    # A linear decay after the warm-up: a constant rate spiked the loss late in training.
    train_supervised(
        model, examples, tokenizer.pad_token_id, max_steps, batch_size, learning_rate, log, masked_batch, decay=True
    )
    return save_model_and_tokenizer(model, tokenizer, output_dir)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", required=True, help="Where to save the model and tokenizer.")
    parser.add_argument("--max_steps", type=int, default=3000, help="Optimizer steps.")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the initialisation and the data order.")
    args = parser.parse_args(argv)
    pretrain_tools(args.output_dir, max_steps=args.max_steps, seed=args.seed)


if __name__ == "__main__":
    main()
