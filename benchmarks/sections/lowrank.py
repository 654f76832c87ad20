"""Section 3, low-rank members, for N in `--lowrank_populations`: a full-rank ES step (members one after another), a
low-rank ES step (`perturbation="lowrank"`: the population in one batched call) and `model.generate` of the same
N x B rows in one call with fixed weights, interleaved, medians: `lowrank_ratio_over_batched_generation` (the largest
N)."""

from __future__ import annotations

import gc

from benchmarks.harness import interleaved, medians, timed
from benchmarks.trainers import es_phases, es_step_seconds, warmed_up_es


def model_sizes(cli) -> set[str]:
    return {cli.lowrank_model}


def run(cli, paths: dict[str, str], device: str) -> dict:
    """One row per population size; prints the table."""
    batch_size = cli.lowrank_batch_size or cli.batch_size
    rows = []
    for population_size in cli.lowrank_populations:
        rows.append(lowrank_row(cli, paths[cli.lowrank_model], population_size, batch_size, device))
        gc.collect()  # the row's trainers, before the next ones are built
    print_table(cli, rows, batch_size)
    largest = max(rows, key=lambda row: row["population_size"])
    return {"rows": rows, "lowrank_ratio_over_batched_generation": largest["lowrank_over_plain_generation"]}


def result_keys(outcome: dict) -> dict:
    keys = {"lowrank_ratio_over_batched_generation": outcome["lowrank_ratio_over_batched_generation"]}
    for row in outcome["rows"]:
        n = row["population_size"]
        keys[f"lowrank_ratio_es_over_generation_n{n}"] = row["lowrank_over_plain_generation"]
        if "fullrank_over_plain_generation" in row:
            keys[f"fullrank_ratio_es_over_batched_generation_n{n}"] = row["fullrank_over_plain_generation"]
    return keys


def plain_batched_generation_seconds(trainer, prompts: list[str]) -> float:
    """`model.generate` of the N x B rows of a step in one call, fixed weights: the floor of any batched population."""
    import torch

    model = trainer.model
    rows = prompts * trainer.args.population_size
    inputs = trainer.processing_class(
        rows, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False
    ).to(model.device)

    def generate():
        with torch.no_grad():
            model.generate(**inputs, generation_config=trainer.generation_config)

    return timed(generate, device=model.device)


def lowrank_row(cli, model_path: str, population_size: int, batch_size: int, device: str) -> dict:
    """Full-rank ES step vs low-rank ES step vs plain batched generation at one population size."""
    tokens = cli.max_completion_length
    low, prompts = warmed_up_es(model_path, population_size, batch_size, tokens, device, perturbation="lowrank",
                                lowrank_rank=cli.lowrank_rank,
                                lowrank_other_parameters=cli.lowrank_other_parameters)  # fmt: skip
    full = warmed_up_es(model_path, population_size, batch_size, tokens, device)[0] if cli.lowrank_fullrank else None
    measurements = {"fullrank_step": lambda: es_step_seconds(full, prompts)} if full is not None else {}
    measurements |= {
        "lowrank_step": lambda: es_step_seconds(low, prompts),
        "plain_batched_generation": lambda: plain_batched_generation_seconds(low, prompts),
    }
    times = interleaved(cli.repetitions, measurements)
    median_seconds = medians(times)
    plain = median_seconds["plain_batched_generation"]
    row = {
        "population_size": population_size,
        "batch_size": batch_size,
        "max_completion_length": tokens,
        "seconds": times,
        "median_seconds": median_seconds,
        "lowrank_phases": es_phases(low, cli.repetitions),
        "lowrank_over_plain_generation": median_seconds["lowrank_step"] / plain,
    }
    if full is not None:
        row["fullrank_over_plain_generation"] = median_seconds["fullrank_step"] / plain
        row["fullrank_over_lowrank"] = median_seconds["fullrank_step"] / median_seconds["lowrank_step"]
    return row


def print_table(cli, rows: list[dict], batch_size: int) -> None:
    print(f"\n== 3. Low-rank members (rank {cli.lowrank_rank}, other parameters {cli.lowrank_other_parameters}): ES "
          f"step vs plain batched generation (interleaved, median of {cli.repetitions}) ==")  # fmt: skip
    print(f"{cli.lowrank_model} model, B={batch_size} prompts, {cli.max_completion_length} tokens; plain = "
          "model.generate of the N x B rows in one call with fixed weights")  # fmt: skip
    print(f"{'N':>4s}{'full-rank s':>13s}{'low-rank s':>12s}{'plain s':>9s}{'low/plain':>11s}{'full/plain':>12s}")
    for row in rows:
        median_seconds, nan = row["median_seconds"], float("nan")
        print(f"{row['population_size']:4d}{median_seconds.get('fullrank_step', nan):13.3f}"
              f"{median_seconds['lowrank_step']:12.3f}{median_seconds['plain_batched_generation']:9.3f}"
              f"{row['lowrank_over_plain_generation']:11.2f}"
              f"{row.get('fullrank_over_plain_generation', nan):12.2f}")  # fmt: skip
