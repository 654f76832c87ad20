"""`report_to="tensorboard"`: the ES metrics, the rewards and the evaluation reach TensorBoard's event files under
sensible names, at the step they were logged at (read back with TensorBoard's own reader)."""

import math
from pathlib import Path

import pytest

from trl_es import ESTrainer
from trl_es.testing import digit_fraction, digit_prompts

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


@pytest.fixture(scope="module")
def run(tiny_model_path, tmp_path_factory):
    """(trainer, {tag: {step: value}}) of a 2-step ES run with an evaluation after every step."""
    from scripts.fast_es import fast_es_config

    output_dir = tmp_path_factory.mktemp("tensorboard") / "run"
    args = fast_es_config(
        output_dir, report_to=["tensorboard"], eval_strategy="steps", eval_steps=1, eval_ks=[1, 2], temperature=1.0
    )
    trainer = ESTrainer(
        model=tiny_model_path,
        reward_funcs=digit_fraction,
        args=args,
        train_dataset=digit_prompts(8),
        eval_dataset=digit_prompts(4, offset=100),
    )
    trainer.train()
    scalars = {}
    for events in Path(output_dir).rglob("events.out.tfevents.*"):
        accumulator = event_accumulator.EventAccumulator(str(events), size_guidance={event_accumulator.SCALARS: 0})
        accumulator.Reload()
        for tag in accumulator.Tags()["scalars"]:
            scalars.setdefault(tag, {}).update({event.step: event.value for event in accumulator.Scalars(tag)})
    return trainer, scalars


def test_es_metrics_and_rewards_are_logged_per_training_step(run):
    _, scalars = run
    for tag in (
        "train/es/fitness/mean",
        "train/es/fitness/std",
        "train/es/update_norm",
        "train/es/param_distance",
        "train/es/time/generate",
        "train/reward",
        "train/rewards/digit_fraction/mean",
        "train/loss",
        "train/num_tokens",
        "train/completions/mean_length",
    ):
        assert set(scalars.get(tag, {})) == {1, 2}, tag


def test_evaluation_metrics_are_logged_under_eval_at_each_evaluation_step(run):
    _, scalars = run
    for tag in ("eval/reward", "eval/loss", "eval/rewards/digit_fraction/mean", "eval/pass@1", "eval/pass@2"):
        assert set(scalars.get(tag, {})) == {1, 2}, tag


def test_every_logged_number_reaches_tensorboard_with_its_value(run):
    trainer, scalars = run
    logged = 0
    for entry in trainer.state.log_history:
        for key, value in entry.items():
            if key in ("step", "epoch") or not isinstance(value, (int, float)) or math.isnan(value):
                continue
            tag = f"eval/{key.removeprefix('eval_')}" if key.startswith("eval_") else f"train/{key}"
            assert scalars[tag][entry["step"]] == pytest.approx(value, rel=1e-6, abs=1e-6), tag
            logged += 1
    assert logged > 30


def test_nothing_a_gradient_method_would_log_appears(run):
    _, scalars = run
    assert not [tag for tag in scalars if "grad_norm" in tag]
