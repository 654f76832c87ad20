"""The training script of `trl-es es` (`trl_es.cli.es`): its datasets and reward functions by name, the built-in
tasks included."""

import pytest
from trl import DatasetMixtureConfig

from trl_es.cli.es import ESScriptArguments, load_datasets, load_reward_funcs


def test_an_unknown_dataset_lists_the_built_in_tasks(tmp_path):
    script_args = ESScriptArguments(dataset_name=str(tmp_path / "missing"))
    with pytest.raises(RuntimeError, match="built-in task: openai/gsm8k, reasoning-gym/gsm_symbolic"):
        load_datasets(script_args, DatasetMixtureConfig(), seed=0, with_eval=False)


def test_the_arithmetic_task_and_its_reward_are_built_in_when_their_module_is_there():
    pytest.importorskip("trl_es.tasks.arithmetic")
    script_args = ESScriptArguments(
        dataset_name="arithmetic", num_offline_problems=4, reward_funcs=["arithmetic_reward"]
    )
    train_dataset, eval_dataset = load_datasets(script_args, DatasetMixtureConfig(), seed=0, with_eval=True)
    assert len(train_dataset) == 4 and {"prompt", "answer"} <= set(train_dataset.column_names)
    assert len(eval_dataset) == 4  # the `test` split
    assert [func.__name__ for func in load_reward_funcs(script_args)] == ["arithmetic_reward"]
