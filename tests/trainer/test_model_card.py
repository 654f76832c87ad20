"""Model cards: what a reader of the Hub page learns about an ES (or ES-then-GRPO) model, and how it reads."""

from pathlib import Path

import pytest
from scripts.fast_es import fast_es_config, fast_grpo_config
from transformers import AutoModelForCausalLM

from trl_es import ESTrainer
from trl_es.testing import digit_fraction
from trl_es.trainer.model_card import (
    es_hyperparameters,
    es_papers,
    generate_es_model_card,
    generate_sequential_model_card,
    hub_id_or_none,
    reward_function_names,
    stage_hyperparameters,
    stage_papers,
    stage_summary,
)
from trl_es.trainer.run_settings import RUN_SETTINGS, card_setting_names


def accuracy_reward(completions, **kwargs):
    return [0.0] * len(completions)


def es_card(config, **overrides):
    settings = dict(
        base_model="Qwen/Qwen2.5-0.5B-Instruct",
        model_name="Qwen2.5-0.5B-ES",
        hub_model_id="someone/Qwen2.5-0.5B-ES",
        dataset_name="openai/gsm8k",
        tags=["trl", "trl-es", "es"],
        hyperparameters=es_hyperparameters(config),
        reward_functions=["accuracy_reward", "format_reward"],
        reward_weights=[1.0, 0.5],
        papers=es_papers(config),
    )
    return generate_es_model_card(**{**settings, **overrides})


@pytest.fixture
def config(tmp_path):
    return fast_es_config(tmp_path / "run")


def test_the_scheduler_is_written_as_in_the_config_not_as_an_enum(config):
    content = es_card(config).content
    assert "| `lr_scheduler_type` | `constant` |" in content
    assert "SchedulerType" not in content


@pytest.mark.parametrize("trackers", [{}, {"wandb_url": "https://wandb.ai/someone/run", "trackio_url": None}])
def test_a_section_with_nothing_to_say_leaves_no_blank_lines(config, trackers):
    content = es_card(config, **trackers).content
    assert "\n\n\n" not in content
    assert ("wandb.ai/someone/run" in content) == bool(trackers)


def test_the_card_names_the_paper_base_model_dataset_and_weighted_rewards(config):
    card = es_card(config)
    assert card.data.base_model == "Qwen/Qwen2.5-0.5B-Instruct" and card.data.datasets == "openai/gsm8k"
    content = card.content
    assert (
        "fine-tuned version of [Qwen/Qwen2.5-0.5B-Instruct](https://huggingface.co/Qwen/Qwen2.5-0.5B-Instruct)"
        in content
    )
    assert "on the [openai/gsm8k](https://huggingface.co/datasets/openai/gsm8k) dataset" in content
    assert "[Evolution Strategies at Scale: LLM Fine-Tuning Beyond Reinforcement Learning]" in content
    assert "(https://huggingface.co/papers/2509.24372)" in content and "@article{qiu2025evolution," in content
    assert "Reward functions (weight): `accuracy_reward` (1.0), `format_reward` (0.5)." in content
    assert 'model="someone/Qwen2.5-0.5B-ES"' in content


def test_equal_reward_weights_are_not_spelled_out(config):
    content = es_card(config, reward_functions=["accuracy_reward"], reward_weights=None).content
    assert "Reward functions: `accuracy_reward`." in content


def table_rows(card) -> dict[str, list[str]]:
    """The hyperparameter table: `{name: [value, meaning]}`."""
    lines = [line for line in card.content.splitlines() if line.startswith("| `")]
    return {cells[0].strip("`"): cells[1:] for cells in (line.strip("| ").split(" | ") for line in lines)}


def test_every_es_hyperparameter_has_a_row_with_its_value_and_meaning(config):
    rows = table_rows(es_card(config))
    for name in ("population_size", "sigma", "antithetic", "fitness_shaping", "perturbation", "learning_rate"):
        assert name in rows, name
    shown = [name for name in card_setting_names(config) if getattr(config, name) not in (None, {})] + ["max_steps"]
    assert set(shown) == set(rows)
    for name in shown:
        value, meaning = rows[name]
        assert value == f"`{'constant' if name == 'lr_scheduler_type' else getattr(config, name)}`", name
        assert meaning.endswith(".") and len(meaning) > 10, (name, meaning)


def test_every_setting_that_decides_the_run_is_in_the_table(tmp_path):
    config = fast_es_config(
        tmp_path / "run",
        data_seed=3,
        lr_scheduler_type="cosine",
        lr_scheduler_kwargs={"num_cycles": 0.5},
        chat_template_kwargs={"enable_thinking": False},
        model_init_kwargs={"dtype": "bfloat16"},
        use_vllm=True,
        vllm_mode="server",
    )
    rows = table_rows(es_card(config))
    # Every run setting that is set; the reward weights are in the card's text.
    decisive = [name for name in RUN_SETTINGS if name != "reward_weights" and getattr(config, name) not in (None, {})]
    assert len(decisive) >= 25 and [name for name in decisive if name not in rows] == []
    assert rows["vllm_mode"][0] == "`server`" and rows["model_init_kwargs"][0] == "`{'dtype': 'bfloat16'}`"
    assert rows["lr_scheduler_type"][0] == "`cosine`" and rows["data_seed"][0] == "`3`"


def test_unset_settings_and_other_backends_settings_have_no_row(config):
    rows = table_rows(es_card(config))
    assert config.data_seed is None and config.chat_template_kwargs is None and not config.use_vllm
    assert not {"data_seed", "chat_template_kwargs", "vllm_mode", "lowrank_rank"} & set(rows)


def test_low_rank_runs_show_their_rank_and_cite_eggroll(tmp_path):
    config = fast_es_config(tmp_path / "run", perturbation="lowrank", lowrank_rank=2, noise_seed=7)
    content = es_card(config).content
    assert "| `lowrank_rank` | `2` |" in content and "| `noise_seed` | `7` |" in content
    assert "low-rank perturbations of [Evolution Strategies at the Hyperscale]" in content
    assert "@article{sarkar2025eggroll," in content


def test_a_local_base_model_and_dataset_are_named_without_their_path(config, tmp_path):
    data = tmp_path / "my-problems"
    data.mkdir()
    card = es_card(config, base_model=None, dataset_name=str(data))
    assert "fine-tuned from a local checkpoint on a local dataset (`my-problems`)" in card.content
    assert str(tmp_path) not in str(card) and card.data.datasets is None


def test_the_card_table_shows_no_token_and_no_local_path(tmp_path):
    token = "hf_" + "QwErTyUiOpAsDfGhJkLzXcVbNmQwEr"
    kwargs = {"token": token, "cache_dir": str(tmp_path / "hf-cache"), "dtype": "float32"}
    config = fast_es_config(tmp_path / "run", model_init_kwargs=kwargs, chat_template_kwargs={"api_key": "sk-1"})
    for card in (es_card(config), sequential_card(tmp_path, es_overrides={"model_init_kwargs": kwargs})):
        assert token not in card.content and "sk-1" not in card.content and str(tmp_path) not in card.content
    rows = table_rows(es_card(config))
    assert rows["model_init_kwargs"][0] == "`{'token': '<TOKEN>', 'cache_dir': 'hf-cache', 'dtype': 'float32'}`"
    assert rows["chat_template_kwargs"][0] == "`{'api_key': '<API_KEY>'}`"
    assert config.model_init_kwargs["token"] == token  # the run itself loads with the token


def test_a_base_model_or_reward_model_given_by_an_absolute_path_is_not_named_by_it():
    gone = "/data/someone/models/reward-model"  # absolute, but not on this machine
    assert hub_id_or_none(gone) is None and hub_id_or_none("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"
    assert reward_function_names([gone, "someone/reward"]) == ["reward-model", "someone/reward"]


def sequential_card(tmp_path, es_overrides=None, **overrides):
    es_args = fast_es_config(tmp_path, sigma=0.05, **(es_overrides or {}))
    stages = [
        {
            "method": method,
            "summary": stage_summary(args),
            "hyperparameters": stage_hyperparameters(args),
            "reward_functions": ["accuracy_reward"],
            "papers": stage_papers(args),
        }
        for method, args in (("ES", es_args), ("GRPO", fast_grpo_config(tmp_path)))
    ]
    settings = dict(base_model="Qwen/Qwen2.5-0.5B-Instruct", model_name="es-then-grpo", stages=stages, tags=["trl"])
    return generate_sequential_model_card(**{**settings, **overrides})


def test_the_sequential_card_has_a_line_and_a_section_per_stage(tmp_path):
    content = sequential_card(tmp_path, dataset_name="openai/gsm8k").content
    assert "trained in 2 stages with `trl-es`'s `SequentialTrainer`: ES → GRPO" in content
    assert "| 0 | ES | `accuracy_reward` | `population_size=4` `sigma=0.05`" in content
    assert "| 1 | GRPO | `accuracy_reward` | `learning_rate=1e-06` `beta=0.0`" in content
    assert "### Stage 0: ES" in content and "| `sigma` | `0.05` | Standard deviation" in content
    assert "### Stage 1: GRPO" in content and "| `beta` | `0.0` |" in content
    for paper in ("2509.24372", "2402.03300", "2608.27351"):
        assert f"https://huggingface.co/papers/{paper}" in content
    assert "\n\n\n" not in content and "subfolder" not in content


def test_the_sequential_card_points_at_the_stage_folders_when_they_are_pushed(tmp_path):
    content = sequential_card(
        tmp_path, hub_model_id="someone/run", stage_folders=["stage-0-es", "stage-1-grpo"]
    ).content
    assert 'from_pretrained("someone/run", subfolder="stage-0-es")' in content
    assert "| `stage-0-es/` |" in content and "| `stage-1-grpo/` |" in content
    assert "\n\n\n" not in content


def test_save_model_writes_an_es_model_card(tiny_model_path, prompts, make_config):
    config = make_config(max_steps=1)
    trainer = ESTrainer(model=tiny_model_path, reward_funcs=digit_fraction, args=config, train_dataset=prompts)
    trainer.train()
    trainer.save_model()
    trainer.create_model_card(model_name="tiny-es")
    card = (Path(config.output_dir) / "README.md").read_text()
    assert AutoModelForCausalLM.from_pretrained(config.output_dir) is not None
    for expected in ("tiny-es", "| `population_size` | `4` |", "| `sigma` | `0.001` |", "2509.24372", "2608.27351"):
        assert expected in card, expected
    assert "trl-es" in card and "tags:" in card
