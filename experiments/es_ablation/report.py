"""The ablation's report, `docs/ablation.md`, and its plot, written from the results file alone (`write_report`), so
that `python -m experiments.es_ablation --report` redraws them without training.

Every number comes with its interval (`trl_es.evaluation.intervals`): a variant's mean over (seed, problem) with the
two-level bootstrap over seeds and problems, and its difference from the default paired by seed and problem. A
setting is *chosen* on training-problem accuracy; held-out numbers are reported beside it, never used to choose.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from experiments.es_ablation.settings import DEFAULT, KNOBS, PASS_KS
from experiments.harness import (
    RESULTS_FILE,
    compared,
    finish_axes,
    interval_cell,
    markdown_table,
    p_value,
    read_results,
    relative_link,
)
from trl_es.evaluation.metrics import pass_at_k


def write_report(output_dir: Path, markdown_path: Path, log=print) -> None:
    results = read_results(output_dir)
    measured = measurements(results)
    plot = plot_differences(results, measured, output_dir / "held_out_differences.png")
    markdown_path.parent.mkdir(parents=True, exist_ok=True)
    links = {
        "plot": relative_link(plot, markdown_path),
        "json": relative_link(output_dir / RESULTS_FILE, markdown_path),
    }
    markdown_path.write_text(render_markdown(results, measured, links))
    log(f"[ablation] wrote {plot} and {markdown_path} from {output_dir / RESULTS_FILE}")


# --------------------------------------------------------------------------------------------------------------------
# Per-problem values and their intervals


def per_problem(run: dict, metric: str, samples: int) -> np.ndarray:
    """One run's values of `metric` on each problem: `train` (greedy correctness on training problems), `greedy`
    (held out) or `pass@k` (held out, unbiased from the run's `samples` samples of each problem)."""
    if metric == "train":
        return np.array(run["train"]["greedy_correct"])
    if metric == "greedy":
        return np.array(run["held_out"]["greedy_correct"])
    return np.array([pass_at_k(samples, correct, int(metric[5:])) for correct in run["held_out"]["correct_samples"]])


def metrics_of(results: dict) -> list[str]:
    samples = results["settings"]["samples_per_prompt"]
    return ["train", "greedy", *(f"pass@{k}" for k in PASS_KS if k <= samples)]


def measurements(results: dict) -> dict:
    """`measured[variant][metric]`: the variant's interval, and for the others the paired difference from the default
    (`vs_default`, with the sign-flip `p` over problems of the per-problem mean difference over seeds)."""
    settings = results["settings"]
    draws, samples = settings["bootstrap_draws"], settings["samples_per_prompt"]
    seeds = [str(seed) for seed in settings["seeds"]]

    def values(variant: str, metric: str) -> np.ndarray:  # (seeds, problems)
        runs = results["runs"][variant]
        return np.stack([per_problem(runs[seed], metric, samples) for seed in seeds])

    measured = {}
    for variant in results["runs"]:
        measured[variant] = {}
        for metric in metrics_of(results):
            default = values(DEFAULT, metric) if variant != DEFAULT else None
            found = compared(values(variant, metric), default, draws)
            if "difference" in found:
                found["vs_default"] = found.pop("difference")
            measured[variant][metric] = found
    return measured


def beats_default(found: dict) -> bool:
    """The paired difference's whole interval lies above 0."""
    return "vs_default" in found and found["vs_default"]["ci"][0] > 0


def below_default(found: dict) -> bool:
    return "vs_default" in found and found["vs_default"]["ci"][1] < 0


# --------------------------------------------------------------------------------------------------------------------
# Markdown


def _difference_cell(found: dict) -> str:
    if "vs_default" not in found:
        return "—"
    difference = found["vs_default"]
    marker = " ▲" if beats_default(found) else " ▼" if below_default(found) else ""
    return f"{interval_cell(difference, signed=True)} {p_value(difference['p'])}{marker}"


def variant_rows(results: dict, measured: dict, variants: list[str]) -> list[list[str]]:
    rows = []
    for variant in variants:
        spec, found = results["variants"][variant], measured[variant]
        row = [
            spec["label"],
            str(spec["steps"]),
            interval_cell(found["train"]["interval"]),
            _difference_cell(found["train"]),
        ]
        row += [interval_cell(found["greedy"]["interval"]), _difference_cell(found["greedy"])]
        row += [_difference_cell(found[metric]) for metric in metrics_of(results)[2:]]
        rows.append(row)
    return rows


def table_header(results: dict) -> list[str]:
    header = ["variant", "steps", "train greedy (chooses)", "Δ train", "held-out greedy", "Δ held-out greedy"]
    return header + [f"Δ held-out {metric.replace('pass', 'Pass')}" for metric in metrics_of(results)[2:]]


def chosen(results: dict, measured: dict, variants: list[str]) -> str:
    """The variant of `variants` with the highest mean training-problem accuracy."""
    return max(variants, key=lambda variant: measured[variant]["train"]["interval"]["mean"])


def knob_reading(results: dict, measured: dict, knob: str, variants: list[str]) -> str:
    """One paragraph, from the numbers: which setting training accuracy chooses, and what the held-out problems say
    about each setting against the default."""
    label = {variant: results["variants"][variant]["label"] for variant in variants}
    pick = chosen(results, measured, variants)
    train = measured[pick]["train"]
    sentences = [
        f"On training problems the best {knob} setting is **{label[pick]}** "
        + (
            "(the default)."
            if pick == DEFAULT
            else f"({interval_cell(train['vs_default'], signed=True)} against the default, "
            + ("beyond its interval)." if beats_default(train) else "within its interval).")
        )
    ]
    better = [v for v in variants if v != DEFAULT and beats_default(measured[v]["greedy"])]
    worse = [v for v in variants if v != DEFAULT and below_default(measured[v]["greedy"])]
    if better:
        sentences.append(
            "Held out, "
            + ", ".join(
                f"{label[v]} beats the default ({interval_cell(measured[v]['greedy']['vs_default'], True)})"
                for v in better
            )
            + " at greedy accuracy, by more than the interval."
        )
    else:
        sentences.append("Held out, no setting beats the default at greedy accuracy by more than its interval.")
    if worse:
        sentences.append(
            "Below the default beyond the interval: "
            + ", ".join(f"{label[v]} ({interval_cell(measured[v]['greedy']['vs_default'], True)})" for v in worse)
            + "."
        )
    coverage = [
        f"{label[v]} at {metric.replace('pass', 'Pass')} ({interval_cell(measured[v][metric]['vs_default'], True)})"
        for v in variants
        if v != DEFAULT
        for metric in metrics_of(results)[3:]
        if beats_default(measured[v][metric])
    ]
    if coverage:
        sentences.append("Coverage above the default beyond the interval: " + ", ".join(coverage) + ".")
    return " ".join(sentences)


def render_markdown(results: dict, measured: dict, links: dict[str, str]) -> str:
    settings, machine = results["settings"], results["machine"]
    variants = list(results["runs"])
    header = table_header(results)
    blocks = [
        "# ES ablation: one knob at a time on the embedded arithmetic task",
        "Each variant changes one `ESConfig` knob from the demo's settings (N=16, σ=0.02, α=0.02, z-score shaping, "
        "one-point estimator, plain SGD step, greedy answers, 64 prompts per step) and trains ES from "
        f"`trl_es/demo/model` with the same budget of **{settings['budget']:,} completions** per run (a larger N "
        f"takes fewer steps), for seeds {', '.join(map(str, settings['seeds']))}. A setting is chosen on the centre's "
        f"greedy accuracy on the first {settings['num_train_eval']} *training* problems; the first "
        f"{settings['num_held_out']} held-out test problems ({settings['samples_per_prompt']} samples each at "
        "temperature 1 for Pass@k) are reported beside it and chose nothing.",
        "Cells are means over seeds and problems with 95% intervals `[low, high]` from a two-level bootstrap "
        f"(seeds and problems resampled, {settings['bootstrap_draws']:,} draws); Δ is the difference from the default "
        "paired by seed and problem, with the paired sign-flip test's p over problems (seeds averaged). ▲/▼: the "
        "whole interval is above/below 0. With 3 seeds the seed level of the bootstrap is coarse.",
        "Reproduce (per-run results are cached in `--work_dir` and reused):",
        f"```bash\n{results['command']}\n```",
        f"Machine: {machine['nproc']} CPU cores, {machine['platform']}, torch {machine['torch']}, transformers "
        f"{machine['transformers']}, TRL {machine['trl']}; {results['workers']} worker processes with "
        f"{results['threads']} torch thread each, cores shared with other jobs. Wall time: "
        f"{results['runtime_s'] / 60:.1f} min.",
        "## Every variant",
        default_coverage(results, measured),
        "\n".join(markdown_table(header, variant_rows(results, measured, variants))),
        f"![Held-out greedy accuracy minus the default's, with 95% intervals]({links['plot']})",
    ]
    for knob in KNOBS:
        in_knob = [v for v in variants if results["variants"][v]["knob"] == knob]
        if not in_knob:
            continue
        knob_variants = [DEFAULT, *in_knob]
        blocks += [
            f"## {knob[0].upper()}{knob[1:]}",
            "\n".join(markdown_table(header, variant_rows(results, measured, knob_variants))),
            knob_reading(results, measured, knob, knob_variants),
        ]
    blocks += [
        summary_section(results, measured, variants),
        f"Every run's numbers: [results.json]({links['json']}).",
    ]
    return "\n\n".join(blocks) + "\n"


def default_coverage(results: dict, measured: dict) -> str:
    """The default's own held-out numbers, which the Δ columns are differences from."""
    found = measured[DEFAULT]
    cells = [
        f"{metric.replace('pass', 'Pass')} {interval_cell(found[metric]['interval'])}"
        for metric in metrics_of(results)[2:]
    ]
    return (
        f"The default's held-out greedy accuracy is {interval_cell(found['greedy']['interval'])}; "
        + ", ".join(cells)
        + "."
    )


def summary_section(results: dict, measured: dict, variants: list[str]) -> str:
    """What the ablation chose, and whether any option beats the defaults held out by more than its interval."""
    label = {variant: results["variants"][variant]["label"] for variant in variants}
    pick = chosen(results, measured, variants)
    better = [v for v in variants if v != DEFAULT and beats_default(measured[v]["greedy"])]
    verdict = (
        "Held out, " + ", ".join(label[v] for v in better) + " beat the defaults at greedy accuracy by more than "
        "the interval."
        if better
        else "Held out, no option beats the defaults at greedy accuracy by more than its interval."
    )
    return (
        f"## What the ablation chose\n\nOn training-problem accuracy the best of all variants is **{label[pick]}** "
        f"({interval_cell(measured[pick]['train']['interval'])}). {verdict}"
    )


# --------------------------------------------------------------------------------------------------------------------
# Plot


def plot_differences(results: dict, measured: dict, path: Path) -> Path:
    """Held-out greedy accuracy minus the default's for every variant, with its 95% interval."""
    from trl_es.evaluation.plots import pyplot, save_figure

    plt = pyplot()
    variants = [v for v in results["runs"] if v != DEFAULT]
    figure, axes = plt.subplots(figsize=(7, 0.35 * len(variants) + 1.5))
    for row, variant in enumerate(variants):
        difference = measured[variant]["greedy"]["vs_default"]
        low, high = difference["ci"]
        axes.errorbar(difference["mean"], row, xerr=[[difference["mean"] - low], [high - difference["mean"]]],
                      marker="o", capsize=3, color="C0", label="variant − default" if row == 0 else None)  # fmt: skip
    axes.axvline(0, color="grey", linewidth=1)
    axes.set_yticks(range(len(variants)), [results["variants"][v]["label"] for v in variants])
    axes.invert_yaxis()
    finish_axes(axes, "Held-out greedy accuracy − default's (95% interval)", "difference", grid="x")
    return save_figure(figure, path)
