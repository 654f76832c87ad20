"""The paper's instruments on checkpoints' weights and logs: parameter shift, functional sparsity and training curves.

A checkpoint is a Hugging Face model folder with safetensors weights. Weight differences Δθ = θ_tuned − θ_base are
taken in float32, one tensor at a time. Sparsification resets the p% smallest |Δθ| to the base and saves the result,
so evaluating it (`trl_es.evaluation.comparison`) measures how much of the update the tuned behaviour needs (the
functional-sparsity measurement). Forgetting, the held-out comparison of checkpoints with intervals and paired tests,
is `trl_es.evaluation.comparison`; plots are in `trl_es.evaluation.plots`.
"""

from __future__ import annotations

import json
import math
import shutil
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

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
