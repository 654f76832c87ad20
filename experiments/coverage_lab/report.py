"""The coverage lab's report, `docs/lab.md`, and its plots, written from the results file alone (`write_report`), so
that `python -m experiments.coverage_lab --report` redraws them without training.

`render_markdown` joins the report's sections, one function each; a section is a list of blocks (paragraphs,
tables, images) that the report separates by blank lines.
"""

from __future__ import annotations

import math
from pathlib import Path

from experiments.coverage_lab.comparisons import COMPARED_KS, comparisons, goal, metrics_compared
from experiments.coverage_lab.plots import plot_frontier, plot_pass_at_k_with_spread, plot_reward_curves
from experiments.coverage_lab.settings import LABELS, MAJ_KS, SPARSITY_PERCENTS
from experiments.coverage_lab.summary import method_metrics
from experiments.harness import (
    RESULTS_FILE,
    cell,
    interval_cell,
    markdown_table,
    p_value,
    read_results,
    relative_link,
    spread,
)
from trl_es.demo.run import DEMO

PASS_KS = (1, 2, 4, 8, 16)  # the Pass@k columns of the results table


def write_report(output_dir: Path, markdown_path: Path, log=print) -> None:
    """Draw the plots and write the Markdown report from `output_dir/results.json` (no training: rerun it after
    changing a plot or the report's layout)."""
    results = read_results(output_dir)
    trained = {method: by_seed for method, by_seed in results["runs"].items() if method != "base"}
    sweep = results["grpo_lr_sweep"]
    plots = {
        "pass_at_k": plot_pass_at_k_with_spread(results["summary"], output_dir / "pass_at_k.png"),
        "frontier": plot_frontier(results["runs"], output_dir / "frontier.png"),
        "curves": plot_reward_curves(trained, sweep, hand_over(results), output_dir / "reward_curves.png"),
        "json": output_dir / RESULTS_FILE,
    }
    markdown_path.parent.mkdir(parents=True, exist_ok=True)
    markdown_path.write_text(render_markdown(results, markdown_path, plots))
    log(f"[lab] wrote {plots['pass_at_k']}, {plots['curves']} and {markdown_path} from {plots['json']}")


def render_markdown(results: dict, markdown_path: Path, plots: dict[str, Path]) -> str:
    """The Markdown report: settings, machine, command, the tables and the plots (relative links)."""
    link = {name: relative_link(path, markdown_path) for name, path in plots.items()}
    sections = [
        introduction(results),
        settings_section(results),
        sweep_section(results),
        results_section(results, link["pass_at_k"]),
        comparisons_section(results, link["frontier"]),
        per_seed_section(results),
        js_diversity_section(results),
        sparsity_section(results),
        curves_and_runtime_section(results, link["curves"], link["json"]),
    ]
    return "\n\n".join(block for section in sections for block in section) + "\n"


def equal_seconds(results: dict) -> bool:
    return results["settings"].get("equal", "completions") == "seconds"


def hand_over(results: dict) -> float | None:
    """Where sequential runs hand over, in completions: half the budget when both stages spend the same number."""
    return None if equal_seconds(results) else results["budget"] / 2


def _shift_cell(stat: dict) -> str:
    return f"{stat['mean']:.2e} ± {stat['std']:.1e}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    return "\n".join(markdown_table(header, rows))


def introduction(results: dict) -> list[str]:
    settings, machine = results["settings"], results["machine"]
    load = machine.get("load_average_at_start")
    equal = "measured training seconds" if equal_seconds(results) else "number of completions"
    title = "at equal training seconds" if equal_seconds(results) else "on the embedded arithmetic model"
    return [
        f"# The coverage lab: ES, GRPO and their sequences {title}",
        "Base, ES, GRPO, ES→GRPO and GRPO→ES, each trained from `trl_es/demo/model` on the offline arithmetic task "
        f"(`trl_es.tasks.arithmetic`, reward 1 when the first number of the answer is right) with the same {equal}, "
        f"for seeds {', '.join(map(str, settings['seeds']))}; measured on the first "
        f"{settings['num_held_out']} problems of the held-out test split ({settings['samples_per_prompt']} samples "
        "per problem at temperature 1; greedy accuracy from one greedy answer). Cells are mean ± sample std over "
        "seeds; per-seed values are below and in the JSON.",
        "Reproduce (all files are rewritten; per-job results are cached in `--work_dir` and reused):",
        f"```bash\n{results['command']}\n```",
        f"Machine: {machine['nproc']} CPU cores (`nproc`), {machine['processor']}, {machine['platform']}, Python "
        f"{machine['python']}, torch {machine['torch']}, transformers {machine['transformers']}, "
        f"TRL {machine['trl']}. {results['workers']} worker processes with {results['threads']} torch thread each; "
        "the cores were shared with other jobs (load average "
        f"{f'{load[0]:.1f}' if load else 'unavailable'} at the start). "
        f"Wall time: {results['runtime_s'] / 60:.1f} min.",
    ]


def settings_section(results: dict) -> list[str]:
    settings = results["settings"]
    es_steps = settings["es_steps"]
    shorter_than_the_demo = (
        f" (the demo runs {DEMO.max_steps}: the lab's budget is {es_steps / DEMO.max_steps:.0%} of the demo's so "
        "that 3 seeds of every method fit in about 40 min on 2 CPU cores; GRPO's backward pass makes its completions "
        "~3x dearer than ES's greedy ones)."
    )
    variant = settings.get("es_variant", "default")
    origin = "the demo's settings" if variant == "default" else f"ablation variant `{variant}`"
    changes = "".join(f", {name}={value}" for name, value in settings.get("es_overrides", {}).items())
    if equal_seconds(results):
        shorter_than_the_demo = "."
    bullets = [
        budget_bullet(results),
        f"- ES ({origin}): N={settings['population_size']}, σ={settings['sigma']}, "
        f"α={settings['es_learning_rate']}{changes}, {settings['prompts_per_step']} prompts per step answered "
        f"greedily by every member ({settings['population_size'] * settings['prompts_per_step']} completions per "
        "step), "
        f"{es_steps} steps" + (shorter_than_the_demo if es_steps != DEMO.max_steps else "."),
        f"- GRPO: {settings['prompts_per_step']} prompts × {settings['num_generations']} generations = "
        f"{settings['prompts_per_step'] * settings['num_generations']} completions per step at temperature 1, "
        f"{results['grpo_steps']} steps, AdamW at lr={results['grpo_learning_rate']:g} with TRL's default linear "
        "decay, beta=0, TRL's default loss (`dapo`), float32.",
        f"- ES→GRPO and GRPO→ES: half the budget in each stage ({es_steps // 2} ES steps, "
        f"{results['grpo_steps'] // 2} GRPO steps), `SequentialTrainer`, each stage from the previous one's model.",
    ]
    return ["## Settings", "\n".join(bullets), *seconds_table(results)]


def budget_bullet(results: dict) -> str:
    settings = results["settings"]
    if not equal_seconds(results):
        return (
            f"- Budget per method and seed: **{results['budget']:,} completions** of at most "
            f"{settings['max_completion_length']} tokens."
        )
    per_step, completions = settings["seconds_per_step"], results["completions"]
    seconds = results["grpo_steps"] * per_step["grpo"]
    return (
        f"- Budget per method and seed: **{seconds:.3g} CPU seconds of training steps**, what GRPO's "
        f"{results['grpo_steps']} steps take at the {per_step['grpo']:.2f} s per step measured before training "
        f"(ES: {per_step['es']:.2f} s per step, so {settings['es_steps']} steps). CPU seconds of the training "
        "process, one torch thread per worker: the compute a step used, however busy the other core was. "
        f"Completions: ES {completions['es']:,}, GRPO {completions['grpo']:,}."
    )


def seconds_table(results: dict) -> list[str]:
    """The training seconds each method used, measured (equal-seconds runs only)."""
    if not equal_seconds(results):
        return []
    rows = []
    for method, by_seed in results["runs"].items():
        if method == "base":
            continue
        cpu = [result["training_seconds"]["cpu"] for result in by_seed.values()]
        wall = [result["training_seconds"]["wall"] for result in by_seed.values()]
        rows.append([LABELS[method], cell(spread(cpu), 0), cell(spread(wall), 0)])
    return [
        "Measured training seconds per run (`TrainingClock`: the training steps of every stage, mean ± std over "
        "seeds; wall seconds include waiting for the shared cores):",
        _table(["method", "CPU seconds", "wall seconds"], rows),
    ]


def sweep_section(results: dict) -> list[str]:
    """The GRPO learning-rate sweep and the rate it chose; nothing when the rate was given."""
    sweep, chosen = results["grpo_lr_sweep"], results["grpo_learning_rate"]
    if not sweep:
        return []
    rates = [entry["learning_rate"] for entry in sweep]
    at_the_edge = (
        " It is at the edge of the grid, so a learning rate beyond it might train faster still (or diverge over the "
        "full run): the sweep did not bracket the best value."
    )
    rows = [[f"{entry['learning_rate']:g}", f"{entry['final_reward']:.3f}"] for entry in sweep]
    return [
        "### GRPO learning rate",
        f"Sweep: {results['settings']['sweep_steps']} GRPO steps per learning rate (seed "
        f"{results['settings']['seeds'][0]}, the full run's schedule), judged on the mean **training** reward of the "
        "last 10 steps (held-out problems play no part):",
        _table(["lr", "training reward (last 10 steps)"], rows),
        f"Chosen: lr={chosen:g}." + (at_the_edge if chosen in (min(rates), max(rates)) else ""),
    ]


def results_section(results: dict, pass_at_k_plot: str) -> list[str]:
    """Every method's mean ± std: greedy accuracy, Pass@k, Maj@k, entropy and the shift from the base."""
    settings = results["settings"]
    maj_ks = [k for k in MAJ_KS if k > 1]
    header = ["method", "greedy", *(f"Pass@{k}" for k in PASS_KS), *(f"Maj@{k}" for k in maj_ks)]
    header += ["entropy", "‖Δθ‖/‖θ‖"]
    rows = []
    for method, metrics in results["summary"].items():
        cells = [LABELS[method], cell(metrics["greedy_accuracy"])]
        cells += [cell(metrics[f"pass@{k}"]) for k in PASS_KS]
        cells += [cell(metrics[f"maj@{k}"]) for k in maj_ks]
        cells += [cell(metrics["entropy"]), _shift_cell(metrics["shift"]) if method != "base" else "0"]
        rows.append(cells)
    return [
        "## Results",
        _table(header, rows),
        "Entropy: mean token entropy (nats) of the sampled answers. ‖Δθ‖/‖θ‖: relative L2 distance of all weights "
        "from the base (`trl_es.evaluation.analysis.parameter_shift`). The base model is measured once (its "
        f"evaluation uses the fixed sampling seed {settings['eval_seed']}), so its std is 0. The standard error of "
        f"one accuracy on {settings['num_held_out']} problems is about "
        f"{math.sqrt(0.25 / settings['num_held_out']):.3f}.",
        f"![Pass@k of the five methods]({pass_at_k_plot})",
    ]


def comparisons_section(results: dict, frontier_plot: str) -> list[str]:
    """Every method's intervals and its paired difference from GRPO and from the base; in an equal-seconds run, the
    goal read from them."""
    metrics = metrics_compared(results)
    names = {"greedy": "greedy", **{f"pass@{k}": f"Pass@{k}" for k in COMPARED_KS}}
    blocks = [
        "## Intervals and paired tests",
        "Means over seeds and held-out problems with 95% intervals from a two-level bootstrap (seeds and problems "
        "resampled; `trl_es.evaluation.intervals`); each difference is paired by seed and problem, with the paired "
        "sign-flip test's p over problems (seeds averaged). The base is one measurement, used for every seed."
        + (
            ""
            if "greedy" in metrics
            else " Greedy accuracy was not recorded per problem in this run, so it has no interval here."
        ),  # fmt: skip
    ]
    for baseline in ("grpo", "base"):
        found = comparisons(results, baseline)
        rows = []
        for method, by_metric in found.items():
            cells = [f"{interval_cell(by_metric[m]['interval'])}" for m in metrics]
            if method != baseline:
                cells = [
                    f"{c}<br>Δ {_difference(by_metric[m]['difference'])}" for c, m in zip(cells, metrics, strict=True)
                ]
            rows.append([LABELS[method], *cells])
        blocks += [f"### Against {LABELS[baseline]}", _table(["method", *(names[m] for m in metrics)], rows)]
        if baseline == "grpo":
            blocks.append(f"![Pass@1 against Pass@16, one point per run]({frontier_plot})")
        if baseline == "grpo" and equal_seconds(results):
            reached = goal(results, found)
            blocks.append(
                "The goal at equal training seconds: "
                + "; ".join(f"{name}: **{'yes' if met else 'no'}**" for name, met in reached.items())
                + "."
            )
    return blocks


def _difference(stat: dict) -> str:
    return f"{interval_cell(stat, signed=True)} {p_value(stat['p'])}"


def per_seed_section(results: dict) -> list[str]:
    metrics = ("greedy_accuracy", "pass@1", "pass@16", "maj@16", "entropy")
    rows = []
    for method, by_seed in results["runs"].items():
        for seed, result in by_seed.items():
            m = method_metrics(result)
            rows.append([LABELS[method], str(seed), *(f"{m[name]:.3f}" for name in metrics), f"{m['shift']:.2e}"])
    header = ["method", "seed", "greedy", "Pass@1", "Pass@16", "Maj@16", "entropy", "‖Δθ‖/‖θ‖"]
    return ["### Per seed", _table(header, rows)]


def js_diversity_section(results: dict) -> list[str]:
    """The JS diversity of ES populations at the start and end of ES (the runs with an ES stage that measured it)."""
    settings = results["settings"]
    rows = []
    for method, metrics in results["summary"].items():
        if "js_diversity/start" in metrics:
            start = "base" if method == "es" else "GRPO half"
            rows.append([
                f"{LABELS[method]} (start: {start})",
                cell(metrics["js_diversity/start"], 4),
                cell(metrics["js_diversity/end"], 4),
                cell(metrics["mean_success/start"]),
                cell(metrics["mean_success/end"]),
            ])  # fmt: skip
    header = ["run", "JS at start", "JS at end", "member success at start", "member success at end"]
    return [
        "## Population JS diversity",
        f"Around a model θ: {settings['js_population']} members θ + σε (σ={settings['sigma']}) each sample "
        f"{settings['js_samples']} answers at temperature 1 to {settings['js_problems']} held-out problems; the "
        "members' per-problem success rates give the verifier-projected JS diversity (bits, "
        "`trl_es.evaluation.metrics.js_diversity`), averaged over problems. Measured at the start and end of ES (the "
        "demo's ES decodes greedily with one completion per prompt, so training logs no diversity). For GRPO→ES the "
        "start is the GRPO checkpoint.",
        _table(header, rows),
    ]


def sparsity_section(results: dict) -> list[str]:
    """Pass@1 of the ES model with its smallest changes reset; nothing when the run measured none."""
    es = results["summary"].get("es", {})
    if not any(name.startswith("sparse-") for name in es):
        return []
    rows = []
    for percent in (0, *SPARSITY_PERCENTS):
        key = f"sparse-{percent}"
        if f"{key}/pass@1" in es:
            values = ", ".join(f"{v:.3f}" for v in es[f"{key}/pass@1"]["values"])
            rows.append([str(percent), cell(es[f"{key}/pass@1"]), cell(es[f"{key}/greedy_accuracy"]), values])
    return [
        "## Sparsified ES checkpoints",
        "The ES model with the p% smallest |Δθ| reset to the base (`trl_es.evaluation.analysis.sparsify`, global "
        f"threshold), measured on the first {results['settings']['num_sparse_held_out']} held-out problems (p=0: the "
        "dense ES model on the same problems).",
        _table(["p (% of coordinates reset)", "Pass@1", "greedy", "per-seed Pass@1"], rows),
    ]


def curves_and_runtime_section(results: dict, curves_plot: str, results_link: str) -> list[str]:
    runtimes = [[name, f"{seconds:.0f}"] for name, seconds in results["job_runtimes_s"].items()]
    return [
        "## Training curves",
        "Reward against completions spent (ES: mean member reward over its greedy answers; GRPO: mean reward of its "
        "samples at temperature 1, so the two are not the same measurement; the dotted line is the hand-over of the "
        "sequential runs; ES is dashed because ES→GRPO's ES stage, with the same seed and a constant step size, "
        "repeats the first half of the ES run exactly). Below: the GRPO learning-rate sweep.",
        f"![Training reward curves]({curves_plot})",
        "## Runtime",
        _table(["job", "seconds"], runtimes),
        f"All numbers: `{results_link}`.",
    ]
