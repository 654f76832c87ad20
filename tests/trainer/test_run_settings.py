"""The settings that decide what an ES run computes (`trl_es.trainer.run_settings`): every one is recorded in a
checkpoint and compared on resume, the low-rank ones for low-rank runs only."""

import json

import pytest

from trl_es.trainer.run_settings import changed_run_settings, run_settings


def test_the_resume_check_compares_every_run_setting_and_only_low_rank_ones_for_low_rank_runs(make_config):
    from trl_es.trainer.run_settings import LOWRANK_RUN_SETTINGS, RUN_SETTINGS, changed_run_settings, run_settings

    full = make_config()
    saved = run_settings(full)
    assert set(saved) == set(RUN_SETTINGS) and changed_run_settings(saved, full) == {}
    lowrank = make_config(perturbation="lowrank", lowrank_rank=2)
    assert set(run_settings(lowrank)) == set(RUN_SETTINGS) | set(LOWRANK_RUN_SETTINGS)
    assert changed_run_settings(run_settings(lowrank), make_config(perturbation="lowrank", lowrank_rank=4)) == {
        "lowrank_rank": (2, 4)
    }
    assert changed_run_settings(saved, lowrank) == {"perturbation": ("full", "lowrank")}
    assert changed_run_settings(json.loads(json.dumps(saved)), full) == {}  # as read back from es_state.json


@pytest.mark.parametrize(
    ("name", "saved", "current"),
    [
        ("perturbation", "full", "lowrank"),
        ("temperature", 1.0, 0.7),
        ("weight_decay", 0.0, 0.1),
        ("reward_weights", None, [2.0]),
        ("warmup_steps", 0, 5),
        ("lr_scheduler_kwargs", None, {"power": 2.0}),
        ("data_seed", None, 3),
        ("shuffle_dataset", True, False),
        ("disable_dropout", True, False),
        ("use_vllm", False, True),
    ],
)
def test_every_setting_that_changes_the_run_is_compared_on_resume(make_config, name, saved, current):
    saved_settings = json.loads(json.dumps(run_settings(make_config(**{name: saved}))))  # as es_state.json holds them
    changed = changed_run_settings(saved_settings, make_config(**{name: current}))
    assert changed[name] == (saved, current)


def test_a_secret_inside_a_run_setting_is_recorded_as_a_placeholder(make_config):
    """Issue 27: checkpoints (`es_state.json`, pushed with `hub_strategy="checkpoint"`) recorded `generation_kwargs`
    and `chat_template_kwargs` as given, secrets included."""
    key = "sk-" + "k" * 40
    config = make_config(generation_kwargs={"api_key": key, "top_k": 3})
    recorded = run_settings(config)
    assert recorded["generation_kwargs"] == {"api_key": "<API_KEY>", "top_k": 3}
    assert key not in json.dumps(recorded)
    assert changed_run_settings(recorded, make_config(generation_kwargs={"api_key": "another", "top_k": 3})) == {}
    assert "generation_kwargs" in changed_run_settings(recorded, make_config(generation_kwargs={"top_k": 4}))
