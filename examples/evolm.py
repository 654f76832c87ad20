"""EVOLM: one model as policy and rubric generator, a small frozen judge, alternating phases (GRPO or ES).

The paper's setting (Qwen3-8B as policy and rubric generator, Qwen3-1.7B as judge, 50 steps per phase, GRPO with
β = 0.001): serve the judge on its own GPU, then train on the others.

    CUDA_VISIBLE_DEVICES=7 vllm serve Qwen/Qwen3-1.7B --port 8001
    accelerate launch --config_file examples/accelerate_configs/multi_gpu.yaml --num_processes 7 \\
        examples/evolm.py --dataset_name my/questions --judge_url http://127.0.0.1:8001

ES for a role instead of GRPO: `--policy_method es` and/or `--rubric_method es`. Offline, on tiny local models
(CPU, about a minute; shows the plumbing, not learning): `python examples/evolm.py --tiny`.
"""

import argparse
import tempfile
from pathlib import Path

from datasets import load_dataset
from trl import GRPOConfig

from trl_es import ESConfig
from trl_es.evolm import EvolmConfig, EvolmTrainer, HFJudge, OpenAIJudge


def role_config(method: str, output_dir: str, tiny: bool):
    if tiny:
        common = dict(max_steps=1, per_device_train_batch_size=4, max_completion_length=8, use_cpu=True)
        common.update(report_to=[], save_strategy="no", logging_steps=1)
        if method == "es":
            return ESConfig(output_dir, population_size=4, **common)
        return GRPOConfig(output_dir, num_generations=2, bf16=False, **common)
    common = dict(max_steps=50, max_completion_length=1024, chat_template_kwargs={"enable_thinking": False})
    if method == "es":
        return ESConfig(output_dir, population_size=16, **common)
    return GRPOConfig(output_dir, beta=0.001, learning_rate=1e-6, **common)


def tiny_setup(work_dir: Path):
    """A tiny policy, a separate tiny judge (log-probability scoring) and offline arithmetic questions."""
    from trl_es.tasks.arithmetic import arithmetic_dataset
    from trl_es.testing import build_tiny_qwen2, build_tiny_tokenizer, save_tiny_model

    model = str(save_tiny_model(work_dir / "policy"))
    tokenizer = build_tiny_tokenizer(individual_digits=True)
    build_tiny_qwen2(tokenizer, seed=1).save_pretrained(work_dir / "judge")
    tokenizer.save_pretrained(work_dir / "judge")
    questions = arithmetic_dataset("train", 8).rename_column("prompt", "question").remove_columns("answer")
    return model, HFJudge(str(work_dir / "judge"), mode="logprob"), questions


def main() -> Path:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="Qwen/Qwen3-8B", help="Policy and rubric generator.")
    parser.add_argument("--judge_url", default="http://127.0.0.1:8001", help="The judge's OpenAI-compatible server.")
    parser.add_argument("--dataset_name", help="A dataset with a `question` column (Hub id or local folder).")
    parser.add_argument("--policy_method", choices=["es", "grpo"], default="grpo")
    parser.add_argument("--rubric_method", choices=["es", "grpo"], default="grpo")
    parser.add_argument("--schedule", choices=["coevolve", "sequential", "static"], default="coevolve")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--output_dir", default="evolm")
    parser.add_argument("--tiny", action="store_true", help="Tiny local models, offline, on CPU.")
    cli = parser.parse_args()

    if cli.tiny:
        model, judge, questions = tiny_setup(Path(tempfile.mkdtemp(prefix="evolm-tiny-")))
        rounds, replay_ages = 1, {"replay_min_age": 0, "replay_max_age": 10}
    else:
        if not cli.dataset_name:
            parser.error("--dataset_name is required (a dataset with a `question` column), or pass --tiny.")
        model, judge = cli.model, OpenAIJudge(cli.judge_url, chat_template_kwargs={"enable_thinking": False})
        questions, rounds, replay_ages = load_dataset(cli.dataset_name, split="train"), cli.rounds, {}
    args = EvolmConfig(
        output_dir=cli.output_dir,
        policy_args=role_config(cli.policy_method, cli.output_dir, cli.tiny),
        rubric_args=role_config(cli.rubric_method, cli.output_dir, cli.tiny),
        schedule=cli.schedule,
        rounds=rounds,
        max_judge_failure_rate=1.0 if cli.tiny else 0.2,  # a random tiny judge is no judge
        **replay_ages,
    )
    final = EvolmTrainer(model, judge, args, questions).train()
    print(f"Final model: {final}")
    return final


if __name__ == "__main__":
    main()
