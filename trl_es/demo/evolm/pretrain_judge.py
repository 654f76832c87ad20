"""Pretrain the EVOLM demo's judge: a small Qwen2 that scores a response against a rubric, never seeing the question.

    python -m trl_es.demo.evolm.pretrain_judge --output_dir trl_es/demo/evolm/judge

Examples are (rubric, response) -> score in the judge's JSON reply (`toy.DEMO_PROMPTS.judge`), with labels from
`toy.judge_label`: a specific rubric is met by a response whose first number is the one it states, the generic rubric
by any number. Labels do not depend on any question, so the judge learns to match patterns and cannot do arithmetic:
whatever it rewards as correct, a rubric said. Hard negatives (a neighbouring number, the digits swapped, a number
sharing a digit) keep it from matching on one digit. Deterministic: one thread, fixed seeds.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from ...evolm.judges import SCORE_PREFIX
from ...tasks.arithmetic import MAX_OPERAND
from ...testing import build_tiny_qwen2
from ..pretrain import completion_example, save_model_and_tokenizer, train_supervised
from .toy import DEMO_PROMPTS, build_toy_tokenizer, judge_label, judge_target, rubric_text

LARGEST = 4 * MAX_OPERAND  # the largest number an answer or a misreading can be (20 + 20)
_NOT_A_NUMBER = ["", " apples", " none", " the answer", " ?"]


def judge_texts(index: int) -> tuple[str, str]:
    """(prompt, reply) of judge example `index`."""
    rng = random.Random(f"judge-{index}")
    stated = None if rng.random() < 0.15 else rng.randrange(LARGEST + 1)
    response = _response(rng, stated)
    rubric = rubric_text(stated)
    prompt = DEMO_PROMPTS.judge.format(rubric=rubric, response=response)
    return prompt, judge_target(judge_label(rubric, response))


def _response(rng: random.Random, stated: int | None) -> str:
    draw = rng.random()
    if stated is not None and draw < 0.45:
        number = stated
    elif stated is not None and draw < 0.7:  # a near miss: a neighbour, the digits swapped, or one digit shared
        near = [stated - 1, stated + 1, int(str(stated)[::-1]), stated + 10, stated - 10, stated % 10]
        number = rng.choice([n for n in near if 0 <= n <= LARGEST and n != stated] or [stated + 1])
    elif draw < 0.9:
        number = rng.randrange(LARGEST + 1)
    else:
        return rng.choice(_NOT_A_NUMBER)
    return f" {number}" + (rng.choice([" apples", " left", ""]) if rng.random() < 0.1 else "")


def pretrain_judge(
    output_dir: str | Path,
    max_steps: int = 3000,
    batch_size: int = 64,
    learning_rate: float = 1e-3,
    num_examples: int = 40_000,
    hidden_size: int = 128,
    num_hidden_layers: int = 2,
    seed: int = 0,
    log=print,
) -> Path:
    """Build the tokenizer and judge, train them for `max_steps` and save both to `output_dir`."""
    tokenizer = build_toy_tokenizer()
    model = build_tiny_qwen2(tokenizer, seed=seed, hidden_size=hidden_size, num_hidden_layers=num_hidden_layers)
    examples = []
    prefix_ids = tokenizer(SCORE_PREFIX)["input_ids"]
    for index in range(num_examples):
        prompt, reply = judge_texts(index)
        # Tokenized as HFJudge reads it (the prompt, then the reply's prefix); the loss falls on the score only.
        prompt_ids = tokenizer(prompt)["input_ids"] + prefix_ids
        examples.append(completion_example(tokenizer, prompt_ids, reply.removeprefix(SCORE_PREFIX)))
    random.Random(seed).shuffle(examples)
    train_supervised(model, examples, tokenizer.pad_token_id, max_steps, batch_size, learning_rate, log)
    return save_model_and_tokenizer(model, tokenizer, output_dir)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", required=True, help="Where to save the judge and its tokenizer.")
    parser.add_argument("--max_steps", type=int, default=3000, help="Optimizer steps.")
    parser.add_argument("--learning_rate", type=float, default=1e-3, help="AdamW's learning rate.")
    parser.add_argument("--hidden_size", type=int, default=128, help="Width of the judge.")
    parser.add_argument("--num_hidden_layers", type=int, default=2, help="Depth of the judge.")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the initialisation and the data order.")
    args = parser.parse_args(argv)
    pretrain_judge(
        args.output_dir,
        max_steps=args.max_steps,
        learning_rate=args.learning_rate,
        hidden_size=args.hidden_size,
        num_hidden_layers=args.num_hidden_layers,
        seed=args.seed,
    )


if __name__ == "__main__":
    main()
