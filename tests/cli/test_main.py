"""The `trl-es` command (`trl_es.cli.main`): `trl-es es`, `trl-es es-then-grpo` and `trl-es grpo-then-es` launching
through accelerate with our configs, and end to end on CPU, `trl-es evolm` included. The stage configs are tested in
tests/sequential/test_stage_configs.py."""

import json
from pathlib import Path

import pytest
import torch
from scripts.paths import ACCELERATE_CONFIGS, REPO
from scripts.trl_es_command import run_trl_es
from trl import GRPOConfig

from trl_es.cli.main import TRAINING_COMMANDS, accelerate_launch_args, main, resolve_accelerate_config_argument

# Launching


def launch_args(command: str, *argv: str) -> list[str]:
    return accelerate_launch_args(TRAINING_COMMANDS[command], list(argv))


def test_accelerate_config_name_becomes_our_config_file():
    args = launch_args("es", "--output_dir", "out", "--accelerate_config", "multi_gpu", "--num_processes", "2")
    script = str(REPO / "trl_es" / "cli" / "es.py")
    assert args == [
        "--config_file",
        str(ACCELERATE_CONFIGS / "multi_gpu.yaml"),
        "--num_processes",
        "2",
        script,
        "--output_dir",
        "out",
    ]


def test_an_accelerate_config_path_is_used_as_it_is(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("distributed_type: 'NO'\n")
    assert resolve_accelerate_config_argument(["--accelerate_config", str(path)]) == ["--config_file", str(path)]


def test_an_unknown_accelerate_config_lists_the_valid_names(capsys):
    names = "deepspeed_zero2, deepspeed_zero3, multi_gpu, multi_node, single_gpu"
    with pytest.raises(ValueError, match=f"Unknown accelerate config 'eight_gpus'.*\\({names}\\)"):
        resolve_accelerate_config_argument(["--accelerate_config", "eight_gpus"])
    with pytest.raises(SystemExit) as exit:
        main(["es", "--output_dir", "out", "--accelerate_config", "eight_gpus"])
    assert exit.value.code == 2 and names in capsys.readouterr().err


def test_the_sequence_commands_set_the_order():
    assert launch_args("grpo-then-es", "--output_dir", "out")[-2:] == ["--order", "grpo-then-es"]
    with pytest.raises(ValueError, match="sets --order es-then-grpo; drop --order"):
        launch_args("es-then-grpo", "--order", "grpo-then-es")


def test_yaml_keys_the_script_does_not_take_go_to_accelerate(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(
        "output_dir: out\nnum_processes: 2\naccelerate_config: multi_gpu\ngrpo_overrides:\n  learning_rate: 1e-6\n"
    )
    args = launch_args("es-then-grpo", "--config", str(config))
    assert args[:4] == ["--config_file", str(ACCELERATE_CONFIGS / "multi_gpu.yaml"), "--num_processes", "2"]
    assert args[4:] == [str(REPO / "trl_es" / "cli" / "sequential.py"), "--config", str(config)] + [
        "--order",
        "es-then-grpo",
    ]


# End to end: the command, accelerate launch and the script, on CPU


@pytest.fixture
def prompts_folder(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    rows = [
        {"prompt": [{"role": "user", "content": f"What is {k} plus 1?"}], "solution": str(k + 1)} for k in range(8)
    ]
    (folder / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder


FAST_FLAGS = dict(
    use_cpu=True,
    per_device_train_batch_size=4,
    population_size=4,
    max_steps=2,
    max_completion_length=8,
    report_to="none",
    save_strategy="no",
)


def saved_args(folder: Path):
    return torch.load(folder / "training_args.bin", weights_only=False)  # our own run's pickle


@pytest.mark.slow
def test_trl_es_es_trains_and_saves_the_model(tmp_path, tiny_model_path, prompts_folder):
    flags = [item for name, value in FAST_FLAGS.items() for item in (f"--{name}", str(value))]
    run_trl_es(
        "es",
        *("--model_name_or_path", tiny_model_path, "--dataset_name", str(prompts_folder)),
        *("--reward_funcs", "accuracy_reward", "trl_es.testing.digit_fraction"),
        *("--output_dir", str(tmp_path / "es"), "--accelerate_config", "multi_gpu", "--num_processes", "2", *flags),
        cwd=tmp_path,
    )
    assert (tmp_path / "es" / "model.safetensors").is_file() and (tmp_path / "es" / "tokenizer.json").is_file()
    assert saved_args(tmp_path / "es").population_size == 4


@pytest.mark.slow
def test_trl_es_es_then_grpo_from_a_yaml_config(tmp_path, tiny_model_path, prompts_folder):
    config = {
        "model_name_or_path": tiny_model_path,
        "dataset_name": str(prompts_folder),
        "reward_funcs": ["trl_es.testing.digit_fraction"],
        "output_dir": str(tmp_path / "run"),
        **FAST_FLAGS,
        "learning_rate": 0.001,
        "temperature": 0.7,
        "grpo_overrides": {"num_generations": 2, "bf16": False, "max_steps": 1, "learning_rate": 3e-6},
        "num_processes": 1,  # no field of the script: goes to accelerate launch
    }
    (tmp_path / "run.yaml").write_text(json.dumps(config))  # JSON is YAML
    run_trl_es("es-then-grpo", "--config", str(tmp_path / "run.yaml"), cwd=tmp_path)

    es_final, grpo_final = tmp_path / "run" / "stage-0-es" / "final", tmp_path / "run" / "stage-1-grpo" / "final"
    assert (es_final / "model.safetensors").is_file() and (grpo_final / "model.safetensors").is_file()
    es_stage, grpo_stage = saved_args(es_final), saved_args(grpo_final)
    assert (es_stage.learning_rate, es_stage.temperature, es_stage.max_steps) == (0.001, 0.7, 2)
    assert isinstance(grpo_stage, GRPOConfig)  # GRPOStageConfig: a GRPOConfig that hides secrets
    assert (grpo_stage.learning_rate, grpo_stage.num_generations, grpo_stage.max_steps) == (3e-6, 2, 1)  # overrides
    assert grpo_stage.temperature == 1.0  # redefined by ES: GRPO's default, not the top-level 0.7
    assert (grpo_stage.max_completion_length, grpo_stage.per_device_train_batch_size) == (8, 4)  # copied
    assert "| 1 | GRPO | " in (grpo_final / "README.md").read_text()


@pytest.mark.slow
def test_trl_es_evolm_runs_policy_and_rubric_phases_with_an_in_process_judge(tmp_path, tiny_model_path):
    from trl_es.testing import build_tiny_qwen2, build_tiny_tokenizer

    # A separate model (the judge is never the trained one), scoring by log-probabilities: a random model writes no
    # JSON, and the startup probe would stop a generating judge.
    judge = tmp_path / "judge"
    tokenizer = build_tiny_tokenizer(individual_digits=True)
    build_tiny_qwen2(tokenizer, seed=1).save_pretrained(judge)
    tokenizer.save_pretrained(judge)
    data = tmp_path / "questions"
    data.mkdir()
    rows = [{"question": f"What is {k} plus 1?", "answer": str(k + 1)} for k in range(4)]
    (data / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    flags = {**FAST_FLAGS, "max_steps": 1, "max_judge_failure_rate": 1.0, "replay_min_age": 0}
    run_trl_es(
        "evolm",
        *("--model_name_or_path", tiny_model_path, "--dataset_name", str(data)),
        *("--judge_model", str(judge), "--judge_mode", "logprob"),
        *("--rounds", "1", "--rubric_overrides", '{"num_generations": 2, "bf16": false}'),
        *("--format_reward_weight", "0.5", "--pair_weights", '{"inferred": 1, "rubric_conditioned": 1}'),
        *("--output_dir", str(tmp_path / "run"), "--num_processes", "1"),
        *[item for name, value in flags.items() for item in (f"--{name}", str(value))],
        cwd=tmp_path,
    )
    policy, rubric = tmp_path / "run" / "stage-0-policy-es", tmp_path / "run" / "stage-1-rubric-grpo"
    assert (policy / "final" / "model.safetensors").is_file() and (rubric / "final" / "model.safetensors").is_file()
    assert saved_args(policy / "final").population_size == 4 and saved_args(rubric / "final").num_generations == 2
    assert saved_args(rubric / "final").reward_weights == [1.0, 0.5]  # the rubric reward's and the format reward's
    assert json.loads((rubric / "phase.json").read_text())["stats"]["temporal"]["built"] == 0
