"""The training script of `trl-es es` (`trl_es.cli.es`): its datasets and reward functions by name, the built-in
tasks included, and `--resume_from_checkpoint true`."""

import json

import pytest
from scripts import counted_rewards
from trl import DatasetMixtureConfig

from trl_es.cli.es import ESScriptArguments, load_datasets, load_reward_funcs, main, make_parser, resume_argument


def parse(*argv: str) -> tuple:
    """(script, training, model, dataset arguments), as the script reads its command line."""
    return make_parser().parse_args_and_config(args=list(argv), fail_with_unknown_args=False)


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


@pytest.mark.parametrize(
    ("given", "resumes_from"),
    [("true", True), ("True", True), ("false", None), ("out/checkpoint-4", "out/checkpoint-4")],
)
def test_resume_from_checkpoint_takes_true_for_the_last_complete_checkpoint_or_a_path(given, resumes_from):
    _, training_args, _, _ = parse("--output_dir", "out", "--resume_from_checkpoint", given)
    assert resume_argument(training_args.resume_from_checkpoint) == resumes_from
    assert type(resume_argument(training_args.resume_from_checkpoint)) is type(resumes_from)


def test_resume_from_checkpoint_true_in_a_yaml_config_and_in_the_help(tmp_path):
    config = tmp_path / "es.yaml"
    config.write_text("output_dir: out\nresume_from_checkpoint: true\n")
    _, training_args, _, _ = parse("--config", str(config))
    assert resume_argument(training_args.resume_from_checkpoint) is True
    assert "or `true` (`True`): the last complete checkpoint in `output_dir`" in " ".join(
        make_parser().format_help().split()
    )


def test_resume_from_checkpoint_true_continues_from_the_last_complete_checkpoint(tmp_path, tiny_model_path):
    data = tmp_path / "prompts"
    data.mkdir()
    (data / "train.jsonl").write_text("".join(json.dumps({"prompt": f"Item {k}:"}) + "\n" for k in range(8)))
    flags = [
        *("--model_name_or_path", tiny_model_path, "--dataset_name", str(data), "--output_dir", str(tmp_path / "es")),
        *("--reward_funcs", "scripts.counted_rewards.counted_digit_fraction", "--population_size", "4"),
        *("--per_device_train_batch_size", "4", "--max_completion_length", "6", "--use_cpu", "true"),
        *("--save_strategy", "steps", "--save_steps", "1", "--report_to", "none", "--disable_tqdm", "true"),
    ]
    main(*parse(*flags, "--max_steps", "2"))
    counted_rewards.calls.clear()
    main(*parse(*flags, "--max_steps", "3", "--resume_from_checkpoint", "true"))
    assert counted_rewards.calls == [4] * 4  # step 3 only: one call per member, on the step's 4 prompts
    assert json.loads((tmp_path / "es" / "checkpoint-3" / "trainer_state.json").read_text())["global_step"] == 3
