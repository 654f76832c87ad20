"""The paper's instruments on checkpoints: parameter shift, functional sparsity, forgetting, and training curves.

A checkpoint is a Hugging Face model folder with safetensors weights. Weight differences Δθ = θ_tuned − θ_base are
taken in float32, one tensor at a time. Sparsification resets the p% smallest |Δθ| to the base and saves the result,
so evaluating it measures how much of the update the tuned behaviour needs (the functional-sparsity measurement).
Forgetting is tuned − base of greedy accuracy, Pass@k and Maj@k on held-out datasets. Plots are in
`trl_es.evaluation.plots`.
"""

from __future__ import annotations

import json
import math
import shutil
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from .coverage import CoverageReport, coverage_report

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
    """Held-out prompts (text or conversations), their reference answers, and the verifier's answer extractor."""

    name: str
    prompts: list
    references: list[str]
    extract_answer: Callable[[str], str | None]
    max_new_tokens: int


def _math_verify_answer(text: str) -> str | None:
    from math_verify import parse

    parsed = parse(text)
    return str(parsed[0]) if parsed else None


def load_eval_dataset(spec: str, num_problems: int = 128, max_new_tokens: int | None = None) -> EvalDataset:
    """`arithmetic` (the offline test split of `trl_es.tasks.arithmetic`), or a local dataset folder / JSON(L) file.

    A local dataset has a `prompt` column and either `answer` (checked with the arithmetic extractor: the first number
    of the completion) or a GSM8K-style `solution` (checked with math-verify, which `pip install math-verify` gives).
    """
    from ..tasks import arithmetic

    if spec == "arithmetic":
        test = arithmetic.arithmetic_dataset("test", num_problems)
        return EvalDataset(
            spec, list(test["prompt"]), list(test["answer"]), arithmetic.extract_answer, max_new_tokens or 4
        )
    from datasets import load_dataset, load_from_disk

    path = Path(spec)
    if not path.exists():
        raise FileNotFoundError(f"Dataset {spec!r}: use `arithmetic`, or a local dataset folder or JSON/JSONL file.")
    data = load_from_disk(spec) if path.is_dir() else load_dataset("json", data_files=spec, split="train")
    data = data.select(range(min(num_problems, len(data))))
    if "prompt" in data.column_names and "answer" in data.column_names:
        references = [str(answer) for answer in data["answer"]]
        return EvalDataset(path.stem, list(data["prompt"]), references, arithmetic.extract_answer, max_new_tokens or 8)
    if "prompt" in data.column_names and "solution" in data.column_names:
        references = [_math_verify_answer(str(solution)) for solution in data["solution"]]
        return EvalDataset(path.stem, list(data["prompt"]), references, _math_verify_answer, max_new_tokens or 512)
    raise ValueError(f"{spec} has columns {data.column_names}: it needs `prompt` and either `answer` or `solution`.")


def evaluate_checkpoint(
    checkpoint: str | Path,
    dataset: EvalDataset,
    ks: Sequence[int] = (1, 2, 4, 8, 16),
    samples_per_prompt: int | None = None,
    temperature: float = 1.0,
    seed: int = 1234,
) -> CoverageReport:
    """Greedy accuracy, Pass@k and Maj@k of a checkpoint on `dataset` (max(ks) samples per prompt by default)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

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
    return coverage_report(
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
    )


def compare_checkpoints(
    checkpoints: Sequence[str | Path], datasets: Sequence[EvalDataset], **evaluation
) -> dict[str, dict[str, CoverageReport]]:
    """`reports[dataset name][checkpoint]` for every checkpoint (the first is the base) on every dataset."""
    if len(set(map(str, checkpoints))) < len(checkpoints):
        raise ValueError(f"{list(map(str, checkpoints))} names a checkpoint twice: give each checkpoint once.")
    return {
        dataset.name: {
            str(checkpoint): evaluate_checkpoint(checkpoint, dataset, **evaluation) for checkpoint in checkpoints
        }
        for dataset in datasets
    }


def forgetting(base: CoverageReport, tuned: CoverageReport) -> dict[str, float]:
    """tuned − base of every measurement: negative where tuning lost ability on this dataset."""
    return {name: tuned.as_dict()[name] - value for name, value in base.as_dict().items()}


def checkpoint_labels(checkpoints: Sequence[str | Path]) -> list[str]:
    """Short names for table columns and legends: folder names, or whole paths when those clash."""
    names = [Path(checkpoint).name for checkpoint in checkpoints]
    return names if len(set(names)) == len(names) else [str(checkpoint) for checkpoint in checkpoints]


def format_comparison(reports: dict[str, dict[str, CoverageReport]]) -> str:
    """One table per dataset: a column per checkpoint, and the change from the first (the base) after each other."""
    tables = []
    for dataset, by_checkpoint in reports.items():
        checkpoints = list(by_checkpoint)
        labels = checkpoint_labels(checkpoints)
        base = by_checkpoint[checkpoints[0]]
        width = max(10, *map(len, labels)) + 2
        header = f"{dataset:<16}{labels[0]:>{width}}" + "".join(f"{label:>{width}}{'Δ':>9}" for label in labels[1:])
        rows = [header]
        for name, value in base.as_dict().items():
            row = f"{name:<16}{value:>{width}.3f}"
            for checkpoint in checkpoints[1:]:
                tuned = by_checkpoint[checkpoint]
                row += f"{tuned.as_dict()[name]:>{width}.3f}{forgetting(base, tuned)[name]:>+9.3f}"
            rows.append(row)
        rows.append(f"{base.num_prompts} problems, {base.samples_per_prompt} samples per problem")
        tables.append("\n".join(rows))
    return "\n\n".join(tables)


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
