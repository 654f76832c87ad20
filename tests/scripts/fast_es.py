"""ES settings that keep the tiny-model tests fast on 2 CPU cores, shared by the tests and the scripts they launch."""

from trl_es import ESConfig

FAST = dict(
    population_size=4,
    per_device_train_batch_size=4,
    max_completion_length=6,
    max_steps=2,
    logging_steps=1,
    save_strategy="no",
    report_to=[],
    disable_tqdm=True,
    use_cpu=True,
)

# Sampling with a visible sigma: every step changes the weights, so a run that diverged from another would show.
MOVING = dict(temperature=1.0, sigma=0.05, learning_rate=0.01)


def fast_es_config(output_dir: str, **overrides) -> ESConfig:
    return ESConfig(output_dir=str(output_dir), **{**FAST, **overrides})
