"""Pretrain the EVOLM demo's two arms from one shared checkpoint: `joint`, whose rubrics know better than its answers
on the same questions, and `null`, whose rubrics make its answers' mistakes.

    python -m trl_es.demo.evolm.pretrain_arms --output_dir trl_es/demo/evolm --seed 0

Supervised next-token training (loss on the completion only) on the `pretrain` split of the arithmetic task, in the
texts of `toy.DEMO_PROMPTS` (with "What is a plus/minus b?" questions on larger operands, which that split lacks:
`pretraining_problem`). Answers misread the operation *systematically*: on the three `HARD_TEMPLATES` of the six
question templates with probability 0.9, elsewhere 0.1, a habit a model learns per question. Then:

1. a **shared base** learns the answers, rubric-conditioned answers, inferred questions and rubrics, each rubric
   written by either arm's rule (half and half), so that neither arm starts closer to the base than the other;
2. each arm is **fine-tuned from the base** on its own rubrics, with the same answers replayed (the answers of both
   arms stay matched):
   - `joint`: a rubric misreads at random, on any template, with probability 0.25: per question, its rubric is right
     more often than its answer (the paper's premise, that judging is easier than answering);
   - `null`: a rubric misreads by the answers' rule (0.9 on the hard templates, 0.1 elsewhere), drawn independently
     of the answer: rubrics and answers are equally often right on every question, so no net signal.

Writes `<output_dir>/joint` and `<output_dir>/null` (and, with `--keep_base`, `<output_dir>/base`); `--from_base`
fine-tunes the arms from a saved base, one arm per process if you like (`--arms joint`), with the same result as one
run. Deterministic: one thread, fixed seeds. The shipped arms (seed 0) took 29 min for the base and 24 min for each
arm on our 2-core machine, with other jobs sharing it. Prints the arms' gates (`gates`) at the end. Of three seeds
of this recipe, seeds 0 and 1 pass all seven; seed 2's joint net signal is +0.133 (needs >= 0.15): its joint rubrics
know less better than its answers (docs: EVOLM, "Pretraining seeds").
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer

from ...tasks.arithmetic import MAX_OPERAND, TEMPLATES, Problem, problem, template_of
from ...testing import build_tiny_qwen2
from ..pretrain import completion_example, save_model_and_tokenizer, train_supervised
from .toy import DEMO_PROMPTS, build_toy_tokenizer, rubric_text

HARD_TEMPLATES = frozenset({0, 2, 4})  # "has ... gets more", "What is a plus b?", "had ... lost"
HARD_MISREAD = 0.9  # how often an answer misreads a question of a hard template
EASY_MISREAD = 0.1  # and of the other templates
JOINT_RUBRIC_MISREAD = 0.25  # how often a joint rubric misreads, whatever the template
ARMS = ("joint", "null")
# The shares of the four kinds of text: in the base, and in an arm's fine-tuning (mostly its rubrics).
BASE_KINDS = {"answer": 0.4, "rubric": 0.4, "conditioned": 0.1, "inferred": 0.1}
ARM_KINDS = {"answer": 0.3, "rubric": 0.6, "conditioned": 0.05, "inferred": 0.05}


# The pretrain split never asks "What is a plus b?" or "What is a minus b?": every such question with the task's
# operands is one of the held-out splits'. The arms learn those templates from operands the task never draws.
WIDE_TEMPLATES = {True: TEMPLATES.index("What is {a} plus {b}?"), False: TEMPLATES.index("What is {a} minus {b}?")}
WIDE_SHARE = 1 / 3  # the share of pretraining examples that ask with those two templates, as the task's questions do


def pretraining_problem(index: int) -> Problem:
    """Example `index`'s problem: the pretrain split's, or (a `WIDE_SHARE` of them) a "What is a plus/minus b?"
    question whose first operand is larger than any the task draws, so that no held-out question is ever seen."""
    rng = random.Random(f"wide-{index}")
    if rng.random() >= WIDE_SHARE:
        return problem("pretrain", index)
    if rng.random() < 0.5:
        a, b = rng.randrange(MAX_OPERAND + 1, 2 * MAX_OPERAND + 1), rng.randrange(MAX_OPERAND + 1)
        return Problem(TEMPLATES[WIDE_TEMPLATES[True]].format(a=a, b=b), a + b, abs(a - b))
    a = rng.randrange(2 * MAX_OPERAND + 1, 3 * MAX_OPERAND + 1)
    b = rng.randrange(a + 1)
    return Problem(TEMPLATES[WIDE_TEMPLATES[False]].format(a=a, b=b), a - b, a + b)


def answer_misread_rate(question: str) -> float:
    """How often a written answer to `question` misreads it: the systematic, learnable error of both arms."""
    return HARD_MISREAD if template_of(question) in HARD_TEMPLATES else EASY_MISREAD


def rubric_misread_rate(question: str, arm: str) -> float:
    """How often a rubric `arm` writes for `question` misreads it."""
    return JOINT_RUBRIC_MISREAD if arm == "joint" else answer_misread_rate(question)


def misreads(index: int, arm: str | None, seed: int) -> tuple[bool, bool]:
    """Whether example `index`'s answer and its rubric misread the question: two independent draws (a rubric of the
    base, `arm=None`, follows either arm's rule, half and half)."""
    question = pretraining_problem(index).question
    rng = random.Random(f"misreads-{seed}-{arm}-{index}")
    answer_misreads = rng.random() < answer_misread_rate(question)
    rubric_arm = arm or rng.choice(ARMS)
    return answer_misreads, rng.random() < rubric_misread_rate(question, rubric_arm)


def arm_texts(index: int, arm: str | None, kinds: dict[str, float], seed: int) -> tuple[str, str]:
    """(prompt, completion) of example `index` of `arm` (None: the base), one of `kinds`."""
    drawn = pretraining_problem(index)
    kind = random.Random(f"kind-{seed}-{arm}-{index}").choices(list(kinds), weights=list(kinds.values()))[0]
    answer_misreads, rubric_misreads = misreads(index, arm, seed)
    answer = drawn.misread_answer if answer_misreads else drawn.answer
    rubric_number = drawn.misread_answer if rubric_misreads else drawn.answer
    if kind == "answer":
        return DEMO_PROMPTS.policy.format(question=drawn.question), f" {answer}"
    if kind == "rubric":
        return DEMO_PROMPTS.rubric_generation.format(question=drawn.question), f" {rubric_text(rubric_number)}"
    if kind == "conditioned":
        prompt = DEMO_PROMPTS.policy_with_rubric.format(question=drawn.question, rubric=rubric_text(rubric_number))
        return prompt, f" {rubric_number}"
    return DEMO_PROMPTS.infer_question.format(response=f" {answer}"), f" {drawn.question}"


def _examples(tokenizer, arm: str | None, kinds: dict[str, float], count: int, offset: int, seed: int):
    examples = []
    for index in range(offset, offset + count):
        prompt, completion = arm_texts(index, arm, kinds, seed)
        examples.append(completion_example(tokenizer, tokenizer(prompt)["input_ids"], completion))
    random.Random(f"order-{seed}-{arm}").shuffle(examples)
    return examples


def pretrain_arms(
    output_dir: str | Path,
    seed: int = 0,
    base_steps: int = 1500,
    arm_steps: int = 1200,
    batch_size: int = 64,
    base_learning_rate: float = 3e-3,
    arm_learning_rate: float = 1e-3,
    num_examples: int = 60_000,
    hidden_size: int = 128,
    num_hidden_layers: int = 4,
    keep_base: bool = False,
    from_base: str | Path | None = None,
    arms: tuple[str, ...] = ARMS,
    log=print,
) -> dict[str, Path]:
    """Train the shared base (or take the one `keep_base` saved, `from_base`), then fine-tune `arms` from it; returns
    each arm's folder."""
    output_dir = Path(output_dir)
    with tempfile.TemporaryDirectory() as scratch:
        if from_base is None:
            sizes = (num_examples, hidden_size, num_hidden_layers)
            base = _train_base(Path(scratch) / "base", seed, base_steps, batch_size, base_learning_rate, *sizes, log)
        else:
            base = Path(from_base)
        tokenizer = AutoTokenizer.from_pretrained(base)
        trained = {}
        for arm in arms:
            arm_model = AutoModelForCausalLM.from_pretrained(base)
            # Fresh problems (after the base's), so that an arm learns its rule, not the base's examples again.
            examples = _examples(tokenizer, arm, ARM_KINDS, num_examples // 2, num_examples, seed)
            log(f"{arm} (seed {seed}): {arm_steps} steps from the base")
            pad = tokenizer.pad_token_id
            train_supervised(arm_model, examples, pad, arm_steps, batch_size, arm_learning_rate, log)
            trained[arm] = save_model_and_tokenizer(arm_model, tokenizer, output_dir / arm)
        if keep_base and from_base is None:
            shutil.copytree(base, output_dir / "base", dirs_exist_ok=True)
    return trained


def _train_base(folder, seed, steps, batch_size, learning_rate, num_examples, hidden_size, num_hidden_layers, log):
    tokenizer = build_toy_tokenizer()
    model = build_tiny_qwen2(tokenizer, seed=seed, hidden_size=hidden_size, num_hidden_layers=num_hidden_layers)
    examples = _examples(tokenizer, None, BASE_KINDS, num_examples, 0, seed)
    log(f"base (seed {seed}): {steps} steps")
    train_supervised(model, examples, tokenizer.pad_token_id, steps, batch_size, learning_rate, log)
    return save_model_and_tokenizer(model, tokenizer, folder)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", required=True, help="Where to save the arms (joint/ and null/).")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the initialisation and the data.")
    parser.add_argument("--base_steps", type=int, default=1500, help="Optimizer steps of the shared base.")
    parser.add_argument("--arm_steps", type=int, default=1200, help="Optimizer steps of each arm's fine-tuning.")
    parser.add_argument("--keep_base", action="store_true", help="Also save the shared base (output_dir/base).")
    parser.add_argument("--from_base", default=None, help="Fine-tune the arms from this saved base instead.")
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS), help="Which arms to fine-tune.")
    args = parser.parse_args(argv)
    arms = pretrain_arms(
        args.output_dir, args.seed, args.base_steps, args.arm_steps, keep_base=args.keep_base,
        from_base=args.from_base, arms=tuple(args.arms),
    )  # fmt: skip
    if set(arms) == set(ARMS):
        from .gates import format_gates
        from .run import measure_gates

        measured, found = measure_gates(arms=arms)
        print(f"Gates of the arms (seed {args.seed}):\n{format_gates(found)}\n{measured}")


if __name__ == "__main__":
    main()
