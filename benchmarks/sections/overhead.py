"""Section 2, speed (`--sections speed`): the ES step's overhead over generation, against B x T.

In one process, interleaved, medians: an ES step (HF backend) against `model.generate` of the same N calls of B rows
with the same seeds and fixed weights, at the users' regime (`overhead_ratio_es_over_generation`), at a small batch
(`..._small_batch`) and at the `--curve` points, printed against B x T. Per member, ES writes the weights and applies
its share of the update at a cost that grows with the parameters P, while generating costs P x B x T: the overhead
falls as 1 / (B x T). GRPO's step time comes from the float32 memory runs (separate processes, not interleaved):
`time_ratio_es_over_grpo_per_step` (`grpo_time_ratio`).
"""

from __future__ import annotations

import gc
import time

from benchmarks.harness import interleaved, medians, synchronize
from benchmarks.trainers import es_own_work_seconds, es_phases, es_step_seconds, warmed_up_es


def parse_setting(text: str) -> tuple[int, int, int]:
    """`"NxBxT"` -> (population size, prompts per step, completion tokens)."""
    try:
        population_size, batch_size, tokens = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise SystemExit(  # noqa: B904 (a usage error, not a failure inside the handler)
            f"A setting is NxBxT, e.g. 4x64x16 (N=4 members, B=64 prompts, T=16 tokens); got {text!r}."
        )
    return population_size, batch_size, tokens


def model_sizes(cli) -> set[str]:
    return {cli.memory_model}


def run(cli, paths: dict[str, str], device: str) -> dict:
    """The users' regime, the small batch and the curve's points, one trainer each; prints the curve."""
    users = (cli.population_size, cli.batch_size, cli.max_completion_length)
    small = parse_setting(cli.small_batch)
    extra = [parse_setting(text) for text in cli.curve]
    settings = list(dict.fromkeys([users, small, *extra]))  # measured in this order; users' regime first
    rows = {}
    for setting in settings:
        rows[setting] = overhead_row(paths[cli.memory_model], setting, cli.repetitions, device)
        gc.collect()  # the row's trainer, before the next one is built
    curve = sorted(rows.values(), key=lambda row: (row["prompt_tokens_per_member_step"], row["population_size"]))
    users_row, small_row = rows[users], rows[small]
    crossing = users_row["fixed_cost_in_row_tokens"] / 0.05 if users_row["overhead_ratio"] > 1 else None
    outcome = {
        "users_regime": users_row,
        "small_batch": small_row,
        "curve": curve,
        "overhead_ratio_es_over_generation": users_row["overhead_ratio"],
        "overhead_ratio_es_over_generation_small_batch": small_row["overhead_ratio"],
        "overhead_crosses_1_05_at_prompt_tokens": crossing,
    }
    print_curve(cli, outcome, users, small)
    return outcome


def result_keys(outcome: dict) -> dict:
    keys = ("overhead_ratio_es_over_generation", "overhead_ratio_es_over_generation_small_batch",
            "overhead_crosses_1_05_at_prompt_tokens")  # fmt: skip
    return {**{key: outcome[key] for key in keys},
            "overhead_ratio_own_work": outcome["users_regime"]["overhead_ratio_own_work"]}  # fmt: skip


def grpo_time_ratio(memory: dict | None, speed: dict | None) -> dict:
    """ES's step (users' regime, median) over GRPO's last step in its float32 memory run: the same N x B completions
    per step, so per completion too. Empty unless both sections ran with the float32 setup."""
    if not (memory and speed and "float32" in memory["setups"]):
        return {}
    grpo_step = memory["setups"]["float32"]["grpo"]["step_seconds"][-1]
    ratio = speed["users_regime"]["median_seconds"]["es_step"] / grpo_step
    print(f"time_ratio_es_over_grpo_per_step = {ratio:.3f} (GRPO's last step in its float32 memory run: "
          f"{grpo_step:.2f} s; the same N x B completions per step, so per completion too)")  # fmt: skip
    return {"time_ratio_es_over_grpo_per_step": ratio, "time_ratio_es_over_grpo_per_completion": ratio}


def generation_seconds(trainer, prompts: list[str]) -> float:
    """`model.generate` of the ES step's calls (N calls of B rows, the step's sampling seed), weights fixed."""
    import torch

    from trl_es.core.noise import sampling_seed

    model = trainer.model
    inputs = trainer.processing_class(
        prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False
    ).to(model.device)
    seed = sampling_seed(trainer.args.seed, trainer.state.global_step)
    devices = [model.device] if model.device.type == "cuda" else []
    start = time.perf_counter()
    with torch.no_grad():
        for _member in range(trainer.args.population_size):
            with torch.random.fork_rng(devices=devices):
                torch.manual_seed(seed)
                output = model.generate(**inputs, generation_config=trainer.generation_config)
    synchronize(model.device)
    seconds = time.perf_counter() - start
    assert output.shape[1] - inputs["input_ids"].shape[1] == trainer.args.max_completion_length
    return seconds


def overhead_row(model_path: str, setting: tuple[int, int, int], repetitions: int, device: str) -> dict:
    """ES step vs fixed-weight generation of the same calls at one NxBxT setting, interleaved, medians."""
    population_size, batch_size, tokens = setting
    trainer, prompts = warmed_up_es(model_path, population_size, batch_size, tokens, device)
    times = interleaved(
        repetitions,
        {
            "es_step": lambda: es_step_seconds(trainer, prompts),
            "generation": lambda: generation_seconds(trainer, prompts),
        },
    )
    median_seconds = medians(times)
    own_work = es_own_work_seconds(trainer, times["es_step"])
    row = {
        "population_size": population_size,
        "batch_size": batch_size,
        "max_completion_length": tokens,
        "prompt_tokens_per_member_step": batch_size * tokens,
        "seconds": times,
        "median_seconds": median_seconds,
        "es_phases": es_phases(trainer, repetitions),
        "overhead_ratio": median_seconds["es_step"] / median_seconds["generation"],
        "es_own_work_seconds": own_work,
        "overhead_ratio_own_work": 1 + own_work / median_seconds["generation"],
    }
    # Per member, ES's own work (writing weights, its share of the update) against generating B x T tokens: the
    # overhead is about 1 + c / (B x T); c is what this row says it is.
    row["fixed_cost_in_row_tokens"] = (row["overhead_ratio"] - 1) * batch_size * tokens
    return row


def print_curve(cli, outcome: dict, users: tuple, small: tuple) -> None:
    curve, crossing = outcome["curve"], outcome["overhead_crosses_1_05_at_prompt_tokens"]
    print(f"\n== 2. ES step vs model.generate of the same calls, against B x T (interleaved, median of "
          f"{cli.repetitions}) ==")  # fmt: skip
    print(f"{'':3s}{'N':>4s}{'B':>5s}{'T':>5s}{'B x T':>7s}{'ES s':>9s}{'gen s':>9s}{'ratio':>8s}{'perturb':>9s}"
          f"{'update':>9s}{'own':>7s}{'c':>8s}")  # fmt: skip
    for row in curve:
        setting = (row["population_size"], row["batch_size"], row["max_completion_length"])
        mark = "*" if setting == users else "s" if setting == small else ""
        phases, median_seconds = row["es_phases"], row["median_seconds"]
        print(f"{mark:3s}{row['population_size']:4d}{row['batch_size']:5d}{row['max_completion_length']:5d}"
              f"{row['prompt_tokens_per_member_step']:7d}{median_seconds['es_step']:9.3f}"
              f"{median_seconds['generation']:9.3f}{row['overhead_ratio']:8.3f}{phases['perturb']:9.3f}"
              f"{phases['update']:9.3f}{row['overhead_ratio_own_work']:7.3f}"
              f"{row['fixed_cost_in_row_tokens']:8.0f}")  # fmt: skip
    print(
        "* users' regime (overhead_ratio_es_over_generation), s small batch (..._small_batch); perturb and update "
        "are the ES step's seconds writing member weights and updating the master; own = 1 + (ES step - its "
        "generation phase) / generation, the ratio from ES's own work only (steadier under load); c = (ratio - 1) x "
        "B x T, ES's work per member in row-tokens of generation (about constant: the overhead falls as 1 / (B x T))"
    )
    if crossing is not None:
        print(f"at the users' regime's c, the overhead falls to 1.05 at B x T ~ {crossing:,.0f} prompt-tokens per "
              "member (an extrapolation: generation's cost per token also changes with the batch)")  # fmt: skip
    if any(row["es_phases"]["zero_update_steps"] for row in curve):
        print("warning: some timed steps had a zero update (equal fitness), which skips the update's noise")
