"""Math benchmarks read from local files in their public formats, checked with math-verify.

`load_benchmark(name, path)` reads a JSONL, JSON or parquet file (or a `save_to_disk` folder) of GSM8K, MATH-500, AIME,
AMC, Minerva Math or OlympiadBench with the release's own column names, and returns the problems as conversations:
the system prompt of the Qwen2.5-Math template, which the ES-at-scale code evaluates with (`SYSTEM_PROMPT`, "Please
reason step by step, and put your final answer within \\boxed{}."), then the problem. Nothing is downloaded: the user
points at the files.

A completion is right when math-verify's `verify(parse(gold), parse(completion))` holds, so `\\frac{1}{2}` and `0.5`
are the same answer where math-verify says so. Maj@k votes on answers by equivalence with the gold: every answer
math-verify verifies as right votes as one class (keyed by the gold answer), and every other answer by the string form
of its parsed value (`str(parse(completion)[0])`), so two wrong answers written differently (`0.3`, `3/10`) that
math-verify would also parse differently count as two candidates.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .coverage import Judge, Verdict

SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` in `text` (braces balanced), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, begin = 0, start + len("\\boxed{")
    for index in range(begin, len(text)):
        depth += {"{": 1, "}": -1}.get(text[index], 0)
        if depth < 0:
            return text[begin:index].strip()
    return None


def _plain(value) -> str:
    """A final-answer cell as text: `142.0` (AMC's floats) -> `142`."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


def _after_hashes(answer: str) -> str:
    """GSM8K's answer is the worked solution ending in `#### 42`: the number after the marks, without commas."""
    if "####" not in answer:
        raise ValueError(f"A GSM8K answer without `#### <number>`: {answer[-80:]!r}")
    return answer.rsplit("####", 1)[1].strip().replace(",", "")


def _from_solution(solution: str) -> str:
    boxed = last_boxed(str(solution))
    if boxed is None:
        raise ValueError(f"A solution without \\boxed{{...}}: {str(solution)[-80:]!r}")
    return boxed


def _final_answers(final_answer) -> str:
    """OlympiadBench's `final_answer` is a list (several for multiple-answer problems): one answer, comma-separated."""
    answers = [final_answer] if isinstance(final_answer, str) else list(final_answer)
    return ", ".join(str(answer).strip().strip("$").strip() for answer in answers)


@dataclass(frozen=True)
class Benchmark:
    """A benchmark's file format: the columns that may hold the problem, and those that may hold the gold answer (each
    with how its cell gives the answer), both tried in order; `release` names the public release of that format."""

    name: str
    problem_columns: tuple[str, ...]
    answer_columns: tuple[tuple[str, Callable[[object], str]], ...]
    release: str


BENCHMARKS = {
    benchmark.name: benchmark
    for benchmark in (
        Benchmark(
            "gsm8k", ("question",), (("answer", _after_hashes),), "openai/gsm8k: `question`, `answer` '... #### 42'"
        ),
        Benchmark(
            "math500",
            ("problem",),
            (("answer", _plain), ("solution", _from_solution)),
            "HuggingFaceH4/MATH-500: `problem`, `solution`, `answer`",
        ),
        Benchmark(
            "aime",
            ("problem", "Problem", "question"),
            (("answer", _plain), ("Answer", _plain)),
            "AIME 2024/2025 releases: `problem`/`Problem` and `answer`/`Answer`",
        ),
        Benchmark("amc", ("problem", "question"), (("answer", _plain),), "AMC releases: `problem`, `answer`"),
        Benchmark(
            "minerva",
            ("problem", "question"),
            (("answer", _plain), ("solution", _from_solution)),
            "Minerva Math: `problem`, `solution` with \\boxed{}",
        ),
        Benchmark(
            "olympiadbench",
            ("question",),
            (("final_answer", _final_answers),),
            "OlympiadBench: `question`, `final_answer` (a list)",
        ),
    )
}


def _read_rows(path: Path):
    from datasets import load_dataset, load_from_disk

    if path.is_dir():
        return load_from_disk(str(path))
    builder = "parquet" if path.suffix == ".parquet" else "json"
    return load_dataset(builder, data_files=str(path), split="train")


def _column(benchmark: Benchmark, candidates: Sequence[str], found: list[str], path: Path, what: str) -> str:
    column = next((name for name in candidates if name in found), None)
    if column is None:
        names = " or ".join(f"`{name}`" for name in candidates)
        raise ValueError(
            f"{path} has columns {found}, but {benchmark.name} needs {what} column {names} ({benchmark.release}): "
            f"point `{benchmark.name}:PATH` at a file in that format, or rename its columns."
        )
    return column


def load_benchmark(name: str, path: str | Path, num_problems: int | None = None) -> tuple[list, list[str]]:
    """The first `num_problems` problems of benchmark `name` in the file or folder `path`, as conversations (system
    prompt, problem), and their gold answers."""
    if name not in BENCHMARKS:
        raise ValueError(f"Unknown benchmark {name!r}: use one of {', '.join(BENCHMARKS)} as `NAME:PATH`.")
    benchmark, path = BENCHMARKS[name], Path(path)
    if not path.exists():
        raise FileNotFoundError(
            f"{name}:{path}: no such file or folder; give the local JSONL or parquet file of {name}."
        )
    rows = _read_rows(path)
    rows = rows.select(range(min(num_problems or len(rows), len(rows))))
    problem = _column(benchmark, benchmark.problem_columns, rows.column_names, path, "a problem")
    answers = dict(benchmark.answer_columns)
    answer = _column(benchmark, list(answers), rows.column_names, path, "an answer")
    prompts = [
        [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": str(text)}]
        for text in rows[problem]
    ]
    return prompts, [answers[answer](cell) for cell in rows[answer]]


def benchmark_dataset(name: str, path: str | Path, num_problems: int | None = None):
    """`load_benchmark` as a `datasets.Dataset` with `prompt` (conversations) and `answer` columns, the eval set
    `CoverageEvalCallback` takes (with `judge=math_verify_judge`) to measure a benchmark during training."""
    from datasets import Dataset

    prompts, answers = load_benchmark(name, path, num_problems)
    return Dataset.from_dict({"prompt": prompts, "answer": answers})


def _as_math(answer: str) -> str:
    """Gold answers are LaTeX without delimiters: math-verify's LaTeX extraction needs them."""
    return answer if "$" in answer or "\\boxed" in answer else f"${answer}$"


def math_verify_answer(text: str) -> str | None:
    """The string form of math-verify's parse of `text` (what Maj@k votes on), or None when it finds no answer."""
    from math_verify import parse

    parsed = parse(text)
    return str(parsed[0]) if parsed else None


def math_verify_judge(references: Sequence[str]) -> Judge:
    """Correct when math-verify verifies the completion's answer against the prompt's gold answer. Answers vote by
    equivalence with the gold (see the module's docstring): a right answer votes as the gold itself."""
    from math_verify import parse, verify

    golds = [parse(_as_math(str(reference))) for reference in references]

    def judge(index: int, texts: list[str], completion_ids: list[list[int]]) -> Verdict:
        reference = str(references[index])
        parsed = [parse(text) for text in texts]
        correct = [bool(answer) and bool(golds[index]) and verify(golds[index], answer) for answer in parsed]
        answers = [
            reference if right else (str(answer[0]) if answer else None)
            for right, answer in zip(correct, parsed, strict=True)
        ]
        return Verdict(correct, answers, reference)

    return judge
