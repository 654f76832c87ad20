"""Settings that keep tiny-model ES and GRPO runs fast on 2 CPU cores; shared by the tests and their scripts."""

from trl import GRPOConfig

from trl_es import ESConfig

# Settings of any tiny-model run, ES or GRPO.
FAST_RUN = dict(
    per_device_train_batch_size=4,
    max_completion_length=6,
    max_steps=2,
    logging_steps=1,
    save_strategy="no",
    report_to=[],
    disable_tqdm=True,
    use_cpu=True,
)
FAST = dict(population_size=4, **FAST_RUN)

# Sampling with a visible sigma: every step changes the weights, so a run that diverged from another would show.
MOVING = dict(temperature=1.0, sigma=0.05, learning_rate=0.01)


def fast_es_config(output_dir: str, **overrides) -> ESConfig:
    return ESConfig(output_dir=str(output_dir), **{**FAST, **overrides})


def fast_grpo_config(output_dir: str, **overrides) -> GRPOConfig:
    """GRPO with the same settings: two completions per prompt (GRPO's minimum), no bf16 on CPU."""
    return GRPOConfig(output_dir=str(output_dir), **{**FAST_RUN, "num_generations": 2, "bf16": False, **overrides})
