"""One test per private name of TRL that trl-es uses (all of them through `trl_es.trl_compat`): a TRL release that
renames or reshapes one fails the test named after it, with the TRL version in the message."""

import inspect

import pytest
import torch
import trl
from scripts.fast_es import fast_grpo_config
from trl import GRPOTrainer

from trl_es import trl_compat
from trl_es.testing import digit_prompts

TRL = f"TRL {trl.__version__}"


def scored(completions, log_metric, log_extra, **kwargs):
    """Scores every completion but the first (`None`), and logs a metric and a column."""
    log_metric("probe", 2.0)
    log_extra("probe_column", [f"c{i}" for i in range(len(completions))])
    return [None] + [float(len(c)) for c in completions[1:]]


@pytest.fixture(scope="module")
def grpo(tiny_model_path, tmp_path_factory):
    config = fast_grpo_config(tmp_path_factory.mktemp("grpo"))
    return GRPOTrainer(model=tiny_model_path, reward_funcs=scored, args=config, train_dataset=digit_prompts(8))


def test_private_names_are_listed_where_the_code_uses_them():
    source = inspect.getsource(trl_compat)
    for function, names in trl_compat.PRIVATE_NAMES.items():
        assert callable(getattr(trl_compat, function)), function
        for name in names:
            assert name.rsplit(".", 1)[-1] in source, (function, name)


def test_grpo_calculate_rewards(grpo):
    parameters = list(inspect.signature(GRPOTrainer._calculate_rewards).parameters)
    assert parameters == ["self", "inputs", "prompts", "completions", "completion_ids_list"], (
        f"{TRL} changed GRPOTrainer._calculate_rewards: {parameters}; update trl_compat.calculate_rewards."
    )
    inputs = [{"prompt": "a"}, {"prompt": "b"}]
    rewards = trl_compat.calculate_rewards(grpo, inputs, ["a", "b"], ["xy", "xyz"], [[1, 2], [1, 2, 3]])
    assert rewards.shape == (2, 1), f"{TRL}: rewards per completion and function, gathered, expected (2, 1)"
    assert torch.isnan(rewards[0, 0]) and rewards[1, 0] == 3.0, f"{TRL}: None must become NaN, scores kept"


def test_grpo_pending_metrics_and_extra_logs(grpo):
    trl_compat.take_reward_logs(grpo)
    trl_compat.calculate_rewards(grpo, [{"prompt": "a"}] * 2, ["a", "a"], ["x", "y"], [[1], [2]])
    metrics, columns = trl_compat.take_reward_logs(grpo)
    assert metrics == {"probe": [2.0]}, f"{TRL} changed where log_metric values wait (GRPOTrainer._pending_metrics)"
    assert columns == {"probe_column": ["c0", "c1"]}, f"{TRL} changed GRPOTrainer._pending_extra_logs"
    assert trl_compat.take_reward_logs(grpo) == ({}, {}), "take_reward_logs must clear what it returns"


def test_grpo_metrics_buffer_feeds_log(grpo):
    metrics = trl_compat.logged_metrics(grpo, "train")
    metrics["probe_metric"].append(3.0)
    logged = {}
    grpo.callback_handler.on_log = lambda args, state, control, logs: logged.update(logs)
    grpo.model.train()
    grpo.log({})
    assert logged.get("probe_metric") == 3.0, f"{TRL}: GRPOTrainer.log no longer averages GRPOTrainer._metrics"


def test_grpo_completion_table(grpo):
    table = trl_compat.completion_table(grpo)
    for column in ("prompt", "completion", "rewards", "advantages", "extra"):
        assert column in table, f"{TRL} changed GRPOTrainer._logs (no {column!r} column)"


def test_grpo_last_loaded_step_guards_engine_syncs():
    source = inspect.getsource(GRPOTrainer)
    assert "self._last_loaded_step" in source and "self.vllm_generation.sync_weights()" in source, (
        f"{TRL} no longer tracks GRPOTrainer._last_loaded_step; update trl_compat.sync_engine_weights."
    )


def test_trl_builds_its_colocated_engine_through_the_llm_name():
    from trl.generation import vllm_generation

    source = inspect.getsource(vllm_generation.VLLMGeneration)
    assert " LLM(" in source or "=LLM(" in source, (
        f"{TRL} no longer creates the colocated engine with trl.generation.vllm_generation.LLM; "
        "update trl_compat.lora_enabled_llm."
    )


def test_trl_finds_the_trackio_space_url_with_its_utils_helper():
    from trl.trainer import utils

    assert callable(getattr(utils, "get_trackio_space_url", None)), (
        f"{TRL} no longer has trl.trainer.utils.get_trackio_space_url; update trl_compat.tracker_urls."
    )
    assert trl_compat.tracker_urls() == {"wandb_url": None, "trackio_url": None}  # no tracker runs in the tests
