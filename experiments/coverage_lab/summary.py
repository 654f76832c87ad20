"""The coverage lab's summary: every metric of every method as mean ± std over seeds (`experiments.harness.spread`)."""

from __future__ import annotations

from experiments.harness import spread


def method_metrics(result: dict) -> dict[str, float]:
    """The flat metrics of one (method, seed) result that the summary aggregates."""
    held_out = result["held_out"]
    metrics = {
        "greedy_accuracy": held_out["greedy_accuracy"],
        "entropy": held_out["entropy"],
        "shift": result["shift"],
    }
    metrics |= {f"pass@{k}": value for k, value in held_out["pass@k"].items()}
    metrics |= {f"maj@{k}": value for k, value in held_out["maj@k"].items()}
    return metrics


def summarize_runs(runs: dict[str, dict[int, dict]]) -> dict[str, dict[str, dict]]:
    """`summary[method][metric] = spread over seeds`, including JS diversity and sparsity where measured."""
    summary = {}
    for method, by_seed in runs.items():
        per_seed = [method_metrics(result) for result in by_seed.values()]
        summary[method] = {name: spread([m[name] for m in per_seed]) for name in per_seed[0]}
        if all("js_diversity" in result for result in by_seed.values()):
            for moment in ("start", "end"):
                for key in ("js_diversity", "mean_success"):
                    values = [result["js_diversity"][moment][key] for result in by_seed.values()]
                    summary[method][f"{key}/{moment}"] = spread(values)
        if all("sparsity" in result for result in by_seed.values()):
            for percent in next(iter(by_seed.values()))["sparsity"]:
                for key in ("pass@1", "greedy_accuracy"):
                    values = [result["sparsity"][percent][key] for result in by_seed.values()]
                    summary[method][f"sparse-{percent}/{key}"] = spread(values)
    return summary
