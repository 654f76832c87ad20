"""GSM8K preparation and the GSM8K example, offline (reasoning-gym problems, tiny local model)."""

import subprocess
import sys

import pytest
from scripts.paths import EXAMPLES

from trl_es.tasks.gsm8k import OFFLINE_DATASET, gsm8k_dataset, gsm8k_solution

EXAMPLE = EXAMPLES / "es_gsm8k.py"


def test_gsm8k_solution_is_the_final_number():
    assert gsm8k_solution("She sells 16 - 3 - 4 = <<16-3-4=9>>9 eggs.\n#### 1,234") == "1234"


def test_offline_problems_are_conversational_with_verifiable_solutions():
    pytest.importorskip("reasoning_gym")
    accuracy_reward = pytest.importorskip("trl.rewards").accuracy_reward
    dataset = gsm8k_dataset(OFFLINE_DATASET, num_offline_problems=8, seed=3)
    assert len(dataset) == 8 and dataset[0]["prompt"][0]["role"] == "user"
    assert all(solution.lstrip("-").isdigit() for solution in dataset["solution"])
    right = [[{"role": "assistant", "content": f"So the answer is \\boxed{{{s}}}."}] for s in dataset["solution"]]
    wrong = [[{"role": "assistant", "content": "So the answer is \\boxed{-999999}."}] for _ in dataset["solution"]]
    assert accuracy_reward(right, dataset["solution"]) == [1.0] * 8
    assert accuracy_reward(wrong, dataset["solution"]) == [0.0] * 8


def test_an_unreachable_hub_points_to_the_offline_problems(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(RuntimeError, match="--dataset_name reasoning-gym/gsm_symbolic"):
        gsm8k_dataset("openai/gsm8k-not-cached-here")


@pytest.mark.slow
def test_the_gsm8k_example_runs_offline(tmp_path, tiny_model_path):
    pytest.importorskip("reasoning_gym")
    flags = dict(
        dataset_name=OFFLINE_DATASET, num_offline_problems=8, model_name_or_path=tiny_model_path,
        output_dir=tmp_path / "es-gsm8k", population_size=2, per_device_train_batch_size=2,
        max_completion_length=8, max_steps=1, dtype="float32",
    )  # fmt: skip
    arguments = [part for name, value in flags.items() for part in (f"--{name}", str(value))]
    run = subprocess.run([sys.executable, str(EXAMPLE), *arguments, "--use_cpu"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    assert (tmp_path / "es-gsm8k" / "model.safetensors").is_file()


def test_the_calculator_evaluates_arithmetic_and_refuses_anything_else():
    from trl_es.tasks.gsm8k import calculator

    assert calculator("(12 + 30) * 4") == "168" and calculator("7 / 2") == "3.5" and calculator(" -3**2 ") == "-9"
    for expression in ("__import__('os').system('true')", "x + 1", "2 ** 1000", "'a' * 3"):
        with pytest.raises(ValueError):
            calculator(expression)


@pytest.mark.slow
def test_the_gsm8k_tools_example_runs_offline_with_tiny(tmp_path):
    pytest.importorskip("reasoning_gym")
    arguments = ["--tiny", "--output_dir", str(tmp_path / "tools"), "--use_cpu", "--dtype", "float32"]
    run = subprocess.run([sys.executable, str(EXAMPLES / "es_gsm8k_tools.py"), *arguments], capture_output=True,
                         text=True)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert (tmp_path / "tools" / "model.safetensors").is_file() and "tools/call_frequency" in run.stdout + run.stderr
