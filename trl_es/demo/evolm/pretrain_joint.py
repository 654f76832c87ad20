"""Pretrain the first EVOLM toy's models (no longer shipped: the demo's arms come from `pretrain_arms`; the rubric
lab's committed results are of these): one small Qwen2 that answers questions and writes rubrics for them.

    python -m trl_es.demo.evolm.pretrain_joint --output_dir trl_es/demo/evolm/joint --rubric_misread 0.3
    python -m trl_es.demo.evolm.pretrain_joint --output_dir trl_es/demo/evolm/null --rubric_misread 0.5

Supervised next-token training (loss on the completion only) on the `pretrain` split of the arithmetic task, in the
texts of `toy.DEMO_PROMPTS`, four kinds mixed:

- answers: "Question: q\\nAnswer:" -> " N", misreading the operation with probability `answer_misread`;
- rubrics: "Question: q\\nRubric:" -> a rubric in EVOLM's JSON schema, generic with probability `generic_rubrics`,
  else stating the misread result with probability `rubric_misread`, else the right one;
- rubric-conditioned answers: question and rubric -> the number the rubric states (generic: an answer as above);
- inferred questions: "Answer: N\\nQuestion:" -> a question whose written answer is N.

`rubric_misread < answer_misread` is the demo's stated asymmetry, the paper's premise that judging is easier than
answering; the null control is pretrained with equal rates. Deterministic: one thread, fixed seeds.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from ...tasks.arithmetic import problem
from ...testing import build_tiny_qwen2
from ..pretrain import completion_example, save_model_and_tokenizer, train_supervised
from .toy import DEMO_PROMPTS, build_toy_tokenizer, rubric_text

KINDS = {"answer": 0.4, "rubric": 0.4, "conditioned": 0.1, "inferred": 0.1}


def joint_texts(index: int, answer_misread: float, rubric_misread: float, generic_rubrics: float) -> tuple[str, str]:
    """(prompt, completion) of pretraining example `index`."""
    drawn = problem("pretrain", index)
    rng = random.Random(f"joint-{index}")
    kind = rng.choices(list(KINDS), weights=list(KINDS.values()))[0]
    answer = drawn.misread_answer if rng.random() < answer_misread else drawn.answer
    if rng.random() < generic_rubrics:
        rubric_number = None
    else:
        rubric_number = drawn.misread_answer if rng.random() < rubric_misread else drawn.answer
    rubric = rubric_text(rubric_number)
    if kind == "answer":
        return DEMO_PROMPTS.policy.format(question=drawn.question), f" {answer}"
    if kind == "rubric":
        return DEMO_PROMPTS.rubric_generation.format(question=drawn.question), f" {rubric}"
    if kind == "conditioned":
        prompt = DEMO_PROMPTS.policy_with_rubric.format(question=drawn.question, rubric=rubric)
        return prompt, f" {answer if rubric_number is None else rubric_number}"
    return DEMO_PROMPTS.infer_question.format(response=f" {answer}"), f" {drawn.question}"


def pretrain_joint(
    output_dir: str | Path,
    rubric_misread: float = 0.3,
    answer_misread: float = 0.5,
    generic_rubrics: float = 0.2,
    max_steps: int = 2500,
    batch_size: int = 64,
    learning_rate: float = 3e-3,
    num_examples: int = 60_000,
    hidden_size: int = 128,
    num_hidden_layers: int = 4,
    seed: int = 0,
    log=print,
) -> Path:
    """Build the tokenizer and model, train them for `max_steps` and save both to `output_dir`."""
    tokenizer = build_toy_tokenizer()
    model = build_tiny_qwen2(tokenizer, seed=seed, hidden_size=hidden_size, num_hidden_layers=num_hidden_layers)
    examples = []
    for index in range(num_examples):
        prompt, completion = joint_texts(index, answer_misread, rubric_misread, generic_rubrics)
        examples.append(completion_example(tokenizer, tokenizer(prompt)["input_ids"], completion))
    random.Random(seed).shuffle(examples)
    train_supervised(model, examples, tokenizer.pad_token_id, max_steps, batch_size, learning_rate, log)
    return save_model_and_tokenizer(model, tokenizer, output_dir)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", required=True, help="Where to save the model and tokenizer.")
    parser.add_argument("--rubric_misread", type=float, default=0.3, help="How often a specific rubric misreads.")
    parser.add_argument("--answer_misread", type=float, default=0.5, help="How often a written answer misreads.")
    parser.add_argument("--generic_rubrics", type=float, default=0.2, help="The fraction of rubrics that are generic.")
    parser.add_argument("--max_steps", type=int, default=2500, help="Optimizer steps.")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the initialisation and the data order.")
    args = parser.parse_args(argv)
    pretrain_joint(
        args.output_dir,
        rubric_misread=args.rubric_misread,
        answer_misread=args.answer_misread,
        generic_rubrics=args.generic_rubrics,
        max_steps=args.max_steps,
        seed=args.seed,
    )


if __name__ == "__main__":
    main()
