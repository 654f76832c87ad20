"""`report_to="tensorboard"`: the ES metrics, the rewards and the evaluation reach TensorBoard's event files under
sensible names, at the step they were logged at, and the config they record names no token and no local path (read
back with TensorBoard's own reader)."""

import json
import math
from pathlib import Path

import pytest

from trl_es import ESTrainer
from trl_es.testing import digit_fraction, digit_prompts

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
tensor_util = pytest.importorskip("tensorboard.util.tensor_util")

# A token for the model's loading, which TensorBoard must not record (the local load ignores it).
MODEL_TOKEN = "hf_" + "TensorBoardMustNotRecordThisOne"


@pytest.fixture(scope="module")
def run(tiny_model_path, tmp_path_factory):
    """(trainer, {tag: {step: value}}) of a 2-step ES run with an evaluation after every step."""
    from scripts.fast_es import fast_es_config

    output_dir = tmp_path_factory.mktemp("tensorboard") / "run"
    args = fast_es_config(
        output_dir,
        report_to=["tensorboard"],
        eval_strategy="steps",
        eval_steps=1,
        eval_ks=[1, 2],
        temperature=1.0,
        model_init_kwargs={"token": MODEL_TOKEN},
        vllm_server_secret_file=str(output_dir.parent / "vllm-server.secret"),
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


def test_the_recorded_config_names_no_token_and_no_local_path(run):
    trainer, _ = run
    output_dir = Path(trainer.args.output_dir)
    [events] = output_dir.rglob("events.out.tfevents.*")
    accumulator = event_accumulator.EventAccumulator(str(events), size_guidance={event_accumulator.TENSORS: 0})
    accumulator.Reload()
    [text] = accumulator.Tensors("args/text_summary")
    recorded = json.loads(tensor_util.make_ndarray(text.tensor_proto).item())
    assert recorded["model_init_kwargs"] == {"token": "<TOKEN>"} and recorded["hub_token"] == "<HUB_TOKEN>"
    assert recorded["output_dir"] == "run" and recorded["vllm_server_secret_file"] == "vllm-server.secret"
    content = events.read_bytes()  # the whole file: the config, the model's config, every logged value
    assert MODEL_TOKEN.encode() not in content and str(output_dir.parent).encode() not in content
