"""PNG plots of the analysis tools (`trl_es.evaluation.analysis`): the |Δθ| histogram, Pass@k curves, training curves.

matplotlib is an optional dependency (`pip install trl-es[analysis]`), imported when a plot is drawn; the Agg backend
writes files without a display. `pyplot` and `save_figure` serve other plots too (the coverage lab's,
`experiments/coverage_lab/`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from .analysis import ParameterShift


def pyplot():
    """matplotlib's `pyplot` with the Agg backend (files, no display); an ImportError that names the `analysis` extra
    when matplotlib is missing."""
    try:
        import matplotlib
    except ImportError as error:
        raise ImportError("Plotting needs matplotlib: `pip install trl-es[analysis]`.") from error
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(figure, path: str | Path) -> Path:
    """Lay out `figure`, write it to `path` (PNG, 120 dpi; parent folders created), close it and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    pyplot().close(figure)
    return path


def plot_shift_histogram(shift: ParameterShift, path: str | Path, title: str | None = None) -> Path:
    """The histogram of |Δθ| on log-log axes; writes `path` (PNG) and returns it."""
    plt = pyplot()
    figure, axes = plt.subplots(figsize=(6, 4))
    edges, counts = shift.histogram_edges, shift.histogram_counts
    if counts:
        axes.stairs(counts, edges, fill=True)
        axes.set_xscale("log")
        axes.set_yscale("log")
    axes.set_xlabel("|Δθ|")
    axes.set_ylabel("coordinates")
    unchanged = f"; {shift.num_unchanged:,} unchanged" if shift.num_unchanged else ""
    axes.set_title(title or f"‖Δθ‖/‖θ‖ = {shift.relative_l2:.3e}{unchanged}")
    return save_figure(figure, path)


def plot_pass_at_k(curves: Mapping[str, Mapping[int, float]], path: str | Path, title: str = "Pass@k") -> Path:
    """Pass@k against k (log scale) for each labelled checkpoint: `curves[label][k] = pass@k`."""
    plt = pyplot()
    figure, axes = plt.subplots(figsize=(6, 4))
    for label, by_k in curves.items():
        ks = sorted(by_k)
        axes.plot(ks, [by_k[k] for k in ks], marker="o", label=label)
    axes.set_xscale("log", base=2)
    all_ks = sorted({k for by_k in curves.values() for k in by_k})
    axes.set_xticks(all_ks, [str(k) for k in all_ks])
    axes.set_xlabel("k")
    axes.set_ylabel("Pass@k")
    axes.set_title(title)
    axes.legend()
    return save_figure(figure, path)


def plot_training_curves(
    runs: Mapping[str, Mapping[str, tuple[Sequence[int], Sequence[float]]]], path: str | Path
) -> Path:
    """One panel per logged metric, a line per run: `runs[label][key] = (steps, values)`."""
    plt = pyplot()
    keys = list(dict.fromkeys(key for curves in runs.values() for key in curves))
    figure, panels = plt.subplots(len(keys) or 1, 1, figsize=(6, 3 * max(len(keys), 1)), squeeze=False)
    for key, axes in zip(keys, panels[:, 0], strict=False):
        for label, curves in runs.items():
            if key in curves:
                axes.plot(*curves[key], label=label)
        axes.set_xlabel("step")
        axes.set_ylabel(key)
        axes.legend()
    return save_figure(figure, path)
