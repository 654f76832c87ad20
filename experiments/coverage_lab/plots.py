"""The coverage lab's plots: Pass@k with its spread over seeds, the Pass@1 / Pass@16 frontier of every run, and the
training-reward curves beside the GRPO learning-rate sweep."""

from __future__ import annotations

from pathlib import Path

from experiments.coverage_lab.settings import LABELS
from experiments.harness import finish_axes
from trl_es.evaluation.plots import pyplot, save_figure


def plot_pass_at_k_with_spread(summary: dict, path: Path) -> Path:
    """Pass@k against k (log2 axis) for every method: the mean over seeds with ±1 std error bars."""
    plt = pyplot()
    figure, axes = plt.subplots(figsize=(6.5, 4.5))
    for method, metrics in summary.items():
        ks = sorted(int(name[5:]) for name in metrics if name.startswith("pass@"))
        means = [metrics[f"pass@{k}"]["mean"] for k in ks]
        stds = [metrics[f"pass@{k}"]["std"] for k in ks]
        axes.errorbar(ks, means, yerr=stds, marker="o", markersize=3, capsize=3, label=LABELS[method])
    axes.set_xscale("log", base=2)
    axes.set_xticks([1, 2, 4, 8, 16], ["1", "2", "4", "8", "16"])
    finish_axes(axes, "Pass@k at equal completion budgets (mean ± std over seeds)", "k (samples at temperature 1)",
                "held-out Pass@k")  # fmt: skip
    return save_figure(figure, path)


def plot_frontier(runs: dict[str, dict[str, dict]], path: Path) -> Path:
    """Held-out Pass@1 against Pass@16, one point per run: where each method sits between sharpening and coverage."""
    plt = pyplot()
    figure, axes = plt.subplots(figsize=(6, 4.5))
    for method, by_seed in runs.items():
        pass_1 = [result["held_out"]["pass@k"]["1"] for result in by_seed.values()]
        pass_16 = [result["held_out"]["pass@k"]["16"] for result in by_seed.values()]
        axes.scatter(pass_1, pass_16, label=LABELS[method], s=30)
    finish_axes(axes, "Pass@1 against Pass@16, one point per run", "held-out Pass@1", "held-out Pass@16")
    return save_figure(figure, path)


def plot_reward_curves(
    runs: dict[str, dict[str, dict]], sweep: list[dict], hand_over: float | None, path: Path
) -> Path:
    """Training reward against completions spent, one line per method and seed (a dotted line where sequential runs
    hand over, when both stages spend the same completions); and the GRPO learning-rate sweep."""
    plt = pyplot()
    figure, (curves_axes, sweep_axes) = plt.subplots(2, 1, figsize=(7, 8))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for color, (method, by_seed) in zip(colors[1:], runs.items(), strict=False):
        # ES on top and dashed: with the same seed, ES→GRPO's ES stage repeats the first half of the ES run exactly.
        style = {"linestyle": "--", "zorder": 3, "linewidth": 1.5} if method == "es" else {"linewidth": 1}
        for index, result in enumerate(by_seed.values()):
            curve = result["curve"]
            label = LABELS[method] if index == 0 else None
            curves_axes.plot(curve["completions"], curve["reward"], color=color, alpha=0.8, label=label, **style)
    if hand_over is not None:
        curves_axes.axvline(hand_over, color="grey", linestyle=":", linewidth=1)
    title = "Training reward, one line per seed\n(ES: mean member reward, greedy; GRPO: samples at T=1)"
    finish_axes(curves_axes, title, "completions spent", "training reward")
    for entry in sweep:
        steps = range(1, len(entry["rewards"]) + 1)
        sweep_axes.plot(steps, entry["rewards"], label=f"lr={entry['learning_rate']:g}")
    finish_axes(sweep_axes, "GRPO learning-rate sweep (judged on training reward only)", "GRPO step (sweep, seed 0)",
                "training reward")  # fmt: skip
    return save_figure(figure, path)
