"""EVOLM with `EvolmTrainer`: `trl-es evolm`, one model as policy and rubric generator under a frozen judge.

    vllm serve Qwen/Qwen3-1.7B --port 8001     # the judge, on its own GPU (on CPU: python -m vllm.entrypoints...)
    trl-es evolm --model_name_or_path Qwen/Qwen3-8B --dataset_name my/questions --question_column question \\
        --judge_url http://127.0.0.1:8001 --policy_method es --rubric_method grpo --max_steps 50 \\
        --rounds 4 --output_dir Qwen3-8B-EVOLM --rubric_overrides '{"learning_rate": 1e-6}'

The top-level flags are parsed as one ESConfig, as for `trl-es es-then-grpo` (`trl_es/sequential/stage_configs.py`):
each role's config is the ES or GRPO config of those flags (`--policy_method`, `--rubric_method`), then its
overrides (`--policy_overrides`, `--rubric_overrides`: JSON on the command line, a mapping in YAML). Without
`--judge_url`, `--judge_model` is loaded in-process as a Hugging Face judge. Phases train in
`output_dir/stage-<i>-<policy|rubric>-<es|grpo>`; run the same command again after an interruption to resume.
"""

import argparse
from dataclasses import dataclass, field

from trl_es.cli.es import check_model, load_datasets, model_init_kwargs
from trl_es.cli.sequential import train_and_push

METHODS = ("es", "grpo")


@dataclass
class EvolmArguments:
    """
    The EVOLM part of `trl-es evolm` (see [`EvolmConfig`] for the meaning of each setting).

    Args:
        judge_url (`str`, *optional*):
            An OpenAI-compatible judge server, e.g. `http://127.0.0.1:8001` (`vllm serve Qwen/Qwen3-1.7B --port 8001`).
        judge_model (`str`, *optional*):
            With `judge_url`: the served model's name (asked from the server when unset). Without: a local folder or
            Hub id loaded in this process as the judge.
        judge_mode (`str`, *optional*, defaults to `"generate"`):
            In-process judge: `"generate"` (sample the JSON answer) or `"logprob"` (read the score from one forward
            pass).
        policy_method, rubric_method (`str`, *optional*, default `"es"` and `"grpo"`):
            Train each role with ES or GRPO.
        policy_overrides, rubric_overrides (`dict` or `str`, *optional*):
            Config fields of one role only.
    """

    judge_url: str | None = field(default=None, metadata={"help": "OpenAI-compatible judge server URL."})
    judge_model: str | None = field(default=None, metadata={"help": "Served judge name, or a local judge model."})
    judge_mode: str = field(
        default="generate", metadata={"help": "In-process judge mode.", "choices": ["generate", "logprob"]}
    )
    schedule: str = field(
        default="coevolve", metadata={"help": "Phase order.", "choices": ["coevolve", "sequential", "static"]}
    )
    rounds: int = field(default=2, metadata={"help": "Policy phases (and rubric phases, except with static)."})
    question_column: str = field(default="question", metadata={"help": "Column holding the questions."})
    rubric_reward: str = field(
        default="indicator", metadata={"help": "Rubric reward.", "choices": ["indicator", "margin", "log_sigmoid"]}
    )
    replay_min_age: int = field(
        default=20, metadata={"help": "Youngest answer age (policy steps) for temporal pairs."}
    )
    replay_max_age: int = field(default=100, metadata={"help": "Oldest answer age (policy steps) for temporal pairs."})
    max_judge_failure_rate: float = field(default=0.2, metadata={"help": "Stop above this judge failure rate."})
    policy_method: str = field(default="es", metadata={"help": "Trainer of policy phases.", "choices": list(METHODS)})
    rubric_method: str = field(
        default="grpo", metadata={"help": "Trainer of rubric phases.", "choices": list(METHODS)}
    )
    policy_overrides: dict | str | None = field(default=None, metadata={"help": "Config fields of policy phases."})
    rubric_overrides: dict | str | None = field(default=None, metadata={"help": "Config fields of rubric phases."})

    def __post_init__(self):
        if self.judge_url is None and self.judge_model is None:
            raise ValueError(
                "No judge: pass --judge_url (an OpenAI-compatible server, e.g. `vllm serve Qwen/Qwen3-1.7B --port "
                "8001` and --judge_url http://127.0.0.1:8001) or --judge_model (a local judge model)."
            )
        for name in ("policy_method", "rubric_method"):
            if getattr(self, name) not in METHODS:
                raise ValueError(f"Unknown {name}={getattr(self, name)!r}: use one of {', '.join(METHODS)}.")

    def role_config(self, args, role: str):
        """The ES or GRPO config of a role, from the top-level `args` and the role's overrides."""
        from trl_es.sequential.stage_configs import stage_config

        return stage_config(args, getattr(self, f"{role}_method"), getattr(self, f"{role}_overrides"))

    def judge(self):
        from trl_es.evolm import HFJudge, OpenAIJudge

        if self.judge_url is not None:
            return OpenAIJudge(self.judge_url, model=self.judge_model)
        return HFJudge(self.judge_model, mode=self.judge_mode)


def main(script_args, evolm_args, training_args, model_args, dataset_args):
    from trl_es.evolm import EvolmConfig, EvolmTrainer

    check_model(model_args)
    training_args.model_init_kwargs = model_init_kwargs(model_args, training_args)
    train_dataset, _ = load_datasets(script_args, dataset_args, seed=training_args.seed, with_eval=False)
    config = EvolmConfig(
        output_dir=training_args.output_dir,
        policy_args=evolm_args.role_config(training_args, "policy"),
        rubric_args=evolm_args.role_config(training_args, "rubric"),
        schedule=evolm_args.schedule,
        rounds=evolm_args.rounds,
        question_column=evolm_args.question_column,
        rubric_reward=evolm_args.rubric_reward,
        replay_min_age=evolm_args.replay_min_age,
        replay_max_age=evolm_args.replay_max_age,
        max_judge_failure_rate=evolm_args.max_judge_failure_rate,
        seed=training_args.seed,
    )
    trainer = EvolmTrainer(model_args.model_name_or_path, evolm_args.judge(), config, train_dataset)
    train_and_push(trainer, training_args, dataset_name=script_args.dataset_name)


def make_parser(prog: str | None = None) -> argparse.ArgumentParser:
    from trl import DatasetMixtureConfig, ModelConfig, TrlParser

    from trl_es.cli.es import ESScriptArguments
    from trl_es.trainer.es_config import ESConfig

    return TrlParser((ESScriptArguments, EvolmArguments, ESConfig, ModelConfig, DatasetMixtureConfig), prog=prog)


if __name__ == "__main__":
    parser = make_parser()
    main(*parser.parse_args_and_config(fail_with_unknown_args=False))
