"""GSM8K for ES and GRPO runs: the Hub dataset, or GSM8K-style problems generated offline by reasoning-gym.

Both give conversational prompts and a `solution` column with the final number, the shape that TRL's
`accuracy_reward` (math-verify) expects.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from datasets import Dataset, load_dataset
from trl import ScriptArguments

HUB_DATASET = "openai/gsm8k"
OFFLINE_DATASET = "reasoning-gym/gsm_symbolic"
INSTRUCTION = "Solve the problem step by step, then give the final answer as \\boxed{<number>}."


def gsm8k_solution(answer: str) -> str:
    """The final number of a GSM8K answer (`"... #### 1,234"` -> `"1234"`)."""
    return answer.split("####")[-1].strip().replace(",", "")


def _as_conversation(question: str, solution: str) -> dict:
    return {"prompt": [{"role": "user", "content": f"{question}\n{INSTRUCTION}"}], "solution": solution}


def gsm8k_dataset(
    name: str = HUB_DATASET,
    config: str | None = "main",
    split: str = "train",
    num_offline_problems: int = 1024,
    seed: int = 0,
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
        rows = [_as_conversation(problem["question"], problem["answer"]) for problem in problems]
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
        lambda row: _as_conversation(row["question"], gsm8k_solution(row["answer"])),
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

    def train_dataset(self, seed: int) -> Dataset:
        return gsm8k_dataset(
            self.dataset_name,
            self.dataset_config,
            split=self.dataset_train_split,
            num_offline_problems=self.num_offline_problems,
            seed=seed,
        )
