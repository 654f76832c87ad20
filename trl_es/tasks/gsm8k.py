"""GSM8K for ES and GRPO runs: the Hub dataset, or GSM8K-style problems generated offline by reasoning-gym.

Both give conversational prompts and a `solution` column with the final number, the shape that TRL's
`accuracy_reward` (math-verify) expects.
"""

from __future__ import annotations

import ast
import operator
from dataclasses import dataclass, field

from datasets import Dataset, load_dataset
from trl import ScriptArguments

HUB_DATASET = "openai/gsm8k"
OFFLINE_DATASET = "reasoning-gym/gsm_symbolic"
INSTRUCTION = "Solve the problem step by step, then give the final answer as \\boxed{<number>}."
TOOL_INSTRUCTION = (
    "Solve the problem step by step, using the calculator for arithmetic, then give the final answer as "
    "\\boxed{<number>}."
)
_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
              ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow, ast.USub: operator.neg,
              ast.UAdd: operator.pos}  # fmt: skip
MAX_EXPONENT = 64  # `9**9**9` would take the process down; no GSM8K step needs more


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: Numbers combined with + - * / // % ** and parentheses, e.g. "(12 + 30) * 4".

    Returns:
        The value, as text.
    """
    value = _evaluate(ast.parse(expression.strip(), mode="eval").body)
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _evaluate(node):
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponent {right} is too large (at most {MAX_EXPONENT})")
        return _OPERATORS[type(node.op)](left, right)
    raise ValueError(f"not arithmetic: {ast.unparse(node)!r} (use numbers, + - * / // % ** and parentheses)")


def gsm8k_solution(answer: str) -> str:
    """The final number of a GSM8K answer (`"... #### 1,234"` -> `"1234"`)."""
    return answer.split("####")[-1].strip().replace(",", "")


def _as_conversation(question: str, solution: str, instruction: str = INSTRUCTION) -> dict:
    return {"prompt": [{"role": "user", "content": f"{question}\n{instruction}"}], "solution": solution}


def gsm8k_dataset(
    name: str = HUB_DATASET,
    config: str | None = "main",
    split: str = "train",
    num_offline_problems: int = 1024,
    seed: int = 0,
    instruction: str = INSTRUCTION,
) -> Dataset:
    """GSM8K as conversational prompts with a `solution` column.

    `name=OFFLINE_DATASET` generates `num_offline_problems` GSM8K-style problems locally with reasoning-gym
    (`gsm_symbolic`), with no network; any other name is loaded from the Hugging Face Hub.
    """
    if name == OFFLINE_DATASET:
        try:
            import reasoning_gym
        except ImportError as error:
            raise ImportError("The offline GSM8K problems need reasoning-gym: `pip install reasoning-gym`.") from error
        problems = reasoning_gym.create_dataset("gsm_symbolic", size=num_offline_problems, seed=seed)
        rows = [_as_conversation(problem["question"], problem["answer"], instruction) for problem in problems]
        return Dataset.from_list(rows)
    try:
        dataset = load_dataset(name, config, split=split)
    except Exception as error:  # network errors, offline mode and missing datasets all surface differently
        raise RuntimeError(
            f"Could not load the dataset {name!r} from the Hugging Face Hub ({type(error).__name__}: {error}). "
            f"Without the Hub, use `--dataset_name {OFFLINE_DATASET}`: reasoning-gym generates GSM8K-style problems "
            "locally."
        ) from error
    return dataset.map(
        lambda row: _as_conversation(row["question"], gsm8k_solution(row["answer"]), instruction),
        remove_columns=dataset.column_names,
    )


@dataclass
class GSM8KScriptArguments(ScriptArguments):
    """The dataset arguments of the GSM8K examples: the Hub dataset, or problems generated offline."""

    dataset_name: str | None = field(
        default=HUB_DATASET, metadata={"help": f"Hub dataset, or {OFFLINE_DATASET} (generated offline)."}
    )
    dataset_config: str | None = field(default="main", metadata={"help": "Configuration of the Hub dataset."})
    num_offline_problems: int = field(default=1024, metadata={"help": "Problems to generate with reasoning-gym."})

    def train_dataset(self, seed: int, instruction: str = INSTRUCTION) -> Dataset:
        return gsm8k_dataset(
            self.dataset_name,
            self.dataset_config,
            split=self.dataset_train_split,
            num_offline_problems=self.num_offline_problems,
            seed=seed,
            instruction=instruction,
        )
