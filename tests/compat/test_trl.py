"""One test per private name of TRL that trl-es uses, and per behaviour of TRL it steps around (all of them through
`trl_es.compat.trl`): a TRL release that renames or reshapes one fails the test named after it, with the TRL version
in the message."""

import inspect

import pytest
import torch
import trl
from scripts.fast_es import fast_es_config, fast_grpo_config
from trl import GRPOConfig, GRPOTrainer

from trl_es.compat import trl as trl_compat
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


def test_grpo_calculate_rewards(grpo):
    parameters = list(inspect.signature(GRPOTrainer._calculate_rewards).parameters)
    assert parameters == ["self", "inputs", "prompts", "completions", "completion_ids_list"], (
        f"{TRL} changed GRPOTrainer._calculate_rewards: {parameters}; update trl_es.compat.trl.calculate_rewards."
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
        f"{TRL} no longer tracks GRPOTrainer._last_loaded_step; update trl_es.compat.trl.sync_engine_weights."
    )


def test_trl_builds_its_colocated_engine_through_the_llm_name():
    from trl.generation import vllm_generation

    source = inspect.getsource(vllm_generation.VLLMGeneration)
    assert " LLM(" in source or "=LLM(" in source, (
        f"{TRL} no longer creates the colocated engine with trl.generation.vllm_generation.LLM; "
        "update trl_es.compat.trl.lora_enabled_llm."
    )


def test_trl_finds_the_trackio_space_url_with_its_utils_helper():
    from trl.trainer import utils

    assert callable(getattr(utils, "get_trackio_space_url", None)), (
        f"{TRL} no longer has trl.trainer.utils.get_trackio_space_url; update trl_es.compat.trl.tracker_urls."
    )
    assert trl_compat.tracker_urls() == {"wandb_url": None, "trackio_url": None}  # no tracker runs in the tests


def test_trl_tags_the_model_with_the_trainers_tag_names(tiny_model_path, tmp_path):
    from trl_es import ESTrainer

    assert "self.model.add_model_tags(self._tag_names)" in inspect.getsource(GRPOTrainer.__init__), (
        f"{TRL} no longer tags the model with GRPOTrainer._tag_names; update trl_es.compat.trl.TrainerTags."
    )
    trainer = ESTrainer(tiny_model_path, scored, args=fast_es_config(tmp_path), train_dataset=digit_prompts(8))
    assert isinstance(trainer, trl_compat.TrainerTags)
    assert set(ESTrainer.model_tags) <= set(trainer.model.model_tags) and "grpo" not in trainer.model.model_tags


def test_grpo_config_refuses_one_completion_per_prompt_which_es_accepts(tmp_path):
    with pytest.raises(ValueError, match="at least 2 generations"):
        GRPOConfig(output_dir=str(tmp_path), num_generations=1, per_device_train_batch_size=4, bf16=False)
    config = fast_es_config(tmp_path, num_generations=1, per_device_train_batch_size=3)
    assert config.num_generations == 1 and config.generation_batch_size == 3, (
        f"{TRL} validates num_generations differently; update trl_es.compat.trl.one_completion_per_prompt_accepted."
    )


def test_grpo_builds_a_reference_model_from_beta_unless_it_sees_the_defaults(tiny_model_path, tmp_path):
    assert "self.beta = args.beta" in inspect.getsource(GRPOTrainer.__init__), (
        f"{TRL} no longer reads the loss fields from args in GRPOTrainer.__init__; update grpo_init_sees_defaults."
    )
    config = fast_grpo_config(tmp_path, beta=0.1)
    with trl_compat.grpo_init_sees_defaults(config, {"beta": 0.0}):
        assert config.beta == 0.0
        trainer = GRPOTrainer(tiny_model_path, scored, args=config, train_dataset=digit_prompts(8))
    assert trainer.ref_model is None, f"{TRL} built a reference model although beta=0"
    assert config.beta == 0.1, "grpo_init_sees_defaults must restore the user's values"


def test_grpo_builds_its_vllm_generation_only_when_it_sees_use_vllm(tmp_path):
    source = inspect.getsource(GRPOTrainer.__init__)
    assert "if self.use_vllm" in source and "VLLMGeneration(" in source, (
        f"{TRL} no longer builds VLLMGeneration under `if self.use_vllm`; update vllm_server_hidden_from_grpo."
    )
    server = fast_grpo_config(tmp_path, use_vllm=True, vllm_mode="server")
    colocate = fast_grpo_config(tmp_path, use_vllm=True, vllm_mode="colocate")
    with trl_compat.vllm_server_hidden_from_grpo(server), trl_compat.vllm_server_hidden_from_grpo(colocate):
        assert server.use_vllm is False and colocate.use_vllm is True
    assert server.use_vllm is True


def test_trl_keeps_its_colocated_engine_in_vllm_generation_llm(grpo):
    from trl.generation.vllm_generation import VLLMGeneration

    assert "self.llm = " in inspect.getsource(VLLMGeneration), (
        f"{TRL} no longer keeps the colocated engine in VLLMGeneration.llm; update release_colocated_engine."
    )
    assert trl_compat.colocated_engine(grpo) is None
    assert trl_compat.release_colocated_engine(grpo) is False  # no engine: nothing to release


async def doubled(value):
    return 2 * value


def test_grpo_starts_an_event_loop_for_async_tools_that_runs_their_coroutines(tiny_model_path, tmp_path):
    """ESTrainer runs async tools on the event loop GRPOTrainer starts for them (`GRPOTrainer.async_loop`)."""

    async def async_reward(completions, **kwargs):
        return [0.0] * len(completions)

    config = fast_grpo_config(tmp_path)
    trainer = GRPOTrainer(
        model=tiny_model_path, reward_funcs=async_reward, args=config, train_dataset=digit_prompts(8)
    )
    run = trl_compat.async_event_loop(trainer)
    assert run is not None, f"{TRL}: GRPOTrainer.async_loop is gone; update trl_es.compat.trl.async_event_loop"
    failing = doubled(None)  # a TypeError inside the coroutine comes back as the result
    outcomes = run([doubled(2), failing])
    assert outcomes[0] == 4 and isinstance(outcomes[1], TypeError), f"{TRL}: {outcomes}"


def test_grpo_passes_trainer_environments_to_reward_functions(grpo):
    """GRPO's reward calculation hands `trainer.environments` to reward functions as `environments`."""
    seen = []

    def reads_environments(completions, environments, **kwargs):
        seen.append(environments)
        return [0.0] * len(completions)

    original = grpo.reward_funcs, grpo.reward_func_names, grpo.reward_weights
    grpo.reward_funcs, grpo.reward_func_names, grpo.reward_weights = [reads_environments], ["env"], torch.ones(1)
    try:
        trl_compat.set_reward_environments(grpo, ["first", "second"])
        trl_compat.calculate_rewards(grpo, [{"prompt": "a"}, {"prompt": "b"}], ["a", "b"], ["x", "y"], [[1], [2]])
    finally:
        grpo.reward_funcs, grpo.reward_func_names, grpo.reward_weights = original
        trl_compat.set_reward_environments(grpo, None)
    assert seen == [["first", "second"]], f"{TRL}: _calculate_rewards no longer passes trainer.environments ({seen})"
