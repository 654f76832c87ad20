"""Section 6, scale (`--sections scale`, not run by default): ES seconds per step against the population size, the
prompt batch and the model size, each varied alone from the users' N and B on `--scale_model`."""

from __future__ import annotations

import gc

from benchmarks.harness import median
from benchmarks.trainers import es_phases, es_step_seconds, warmed_up_es


def model_sizes(cli) -> set[str]:
    return {cli.scale_model, *cli.model_sizes}


def run(cli, paths: dict[str, str], device: str) -> dict:
    """Three tables (population size, batch size, model varies); a setting in more than one is measured once."""
    measured = {}

    def measure(size: str, population_size: int, batch_size: int) -> dict:
        key = (size, population_size, batch_size)
        if key not in measured:
            measured[key] = scale_row(cli, paths, device, *key)
            gc.collect()  # the row's trainer, before the next one is built
        return measured[key]

    tables = {
        "population_size": [measure(cli.scale_model, n, cli.batch_size) for n in cli.populations],
        "batch_size": [measure(cli.scale_model, cli.population_size, b) for b in cli.batch_sizes],
        "model": [measure(size, cli.population_size, cli.batch_size) for size in cli.model_sizes],
    }
    print_tables(cli, tables)
    return tables


def result_keys(outcome: dict) -> dict:
    return {}  # the tables stay under RESULT's "scale"


def scale_row(cli, paths: dict[str, str], device: str, size: str, population_size: int, batch_size: int) -> dict:
    trainer, prompts = warmed_up_es(paths[size], population_size, batch_size, cli.max_completion_length, device)
    seconds = [es_step_seconds(trainer, prompts) for _ in range(cli.repetitions)]
    row = {
        "model": size,
        "population_size": population_size,
        "batch_size": batch_size,
        "seconds": seconds,
        "seconds_per_step": median(seconds),
        "seconds_per_completion": median(seconds) / (population_size * batch_size),
        "phases": es_phases(trainer, cli.repetitions),
    }
    return row


def print_tables(cli, tables: dict[str, list[dict]]) -> None:
    print(f"\n== 6. ES seconds per step (median of {cli.repetitions}; {cli.max_completion_length} tokens) ==")
    for varied, rows in tables.items():
        print(f"-- {varied} varies")
        print(f"{'model':>6s}{'N':>5s}{'B':>5s}{'s/step':>9s}{'ms/compl':>10s}{'perturb':>9s}{'generate':>10s}"
              f"{'update':>9s}")  # fmt: skip
        for row in rows:
            phases = row["phases"]
            print(f"{row['model']:>6s}{row['population_size']:5d}{row['batch_size']:5d}{row['seconds_per_step']:9.3f}"
                  f"{1e3 * row['seconds_per_completion']:10.1f}{phases['perturb']:9.3f}{phases['generate']:10.3f}"
                  f"{phases['update']:9.3f}")  # fmt: skip
