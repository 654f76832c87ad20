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
        judge_panel_urls (`list[str]`, *optional*):
            Several OpenAI-compatible judge servers scoring as a panel (`JudgePanel`), instead of `judge_url`.
        judge_panel_reduce (`str`, *optional*, defaults to `"mean"`):
            How a panel combines its judges' scores: `"mean"` or `"median"`.
        judge_api_key_env (`str`, *optional*):
            The environment variable holding the judge servers' API key (never logged).
        pair_weights (`dict` or `str`, *optional*):
            The mixture of pair sources, e.g. `'{"temporal": 1, "inferred": 1}'` (JSON on the command line).
        live_rubrics, rubric_temperature, answer_temperature, inference_temperature, rubric_reward_weight,
        format_reward_weight, invalid_rubric_score, guard_steps, guard_accuracy_drop, guard_action:
            As in [`EvolmConfig`]. The KL anchor of each phase to its start is a role's own config field:
            `--kl_anchor_beta` for ES phases, `--beta` for GRPO phases (top level, or in a role's overrides).
        verifier (`str`, *optional*):
            Import path of a function without arguments that returns an `EvalVerifier` (evaluation only: diagnostics
            and the reward-hacking guard), e.g. `my_task.verifier`.
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
    judge_panel_urls: list[str] | None = field(
        default=None, metadata={"help": "Several judge server URLs scoring as a panel (instead of --judge_url)."}
    )
    judge_panel_reduce: str = field(
        default="mean", metadata={"help": "How a panel combines its scores.", "choices": ["mean", "median"]}
    )
    judge_api_key_env: str | None = field(
        default=None, metadata={"help": "Environment variable holding the judge servers' API key."}
    )
    pair_weights: dict | str | None = field(
        default=None, metadata={"help": "Pair source weights, JSON: temporal, inferred, rubric_conditioned."}
    )
    live_rubrics: bool = field(
        default=False, metadata={"help": "Policy phases read rubrics the trained model writes at every step."}
    )
    rubric_temperature: float = field(default=0.6, metadata={"help": "Sampling temperature of the rubrics."})
    answer_temperature: float = field(default=1.0, metadata={"help": "Sampling temperature of phase answers."})
    inference_temperature: float = field(default=0.3, metadata={"help": "Temperature of inferred questions."})
    rubric_reward_weight: float = field(default=1.0, metadata={"help": "Weight of the rubric reward."})
    format_reward_weight: float = field(default=0.0, metadata={"help": "Weight of the rubric format reward."})
    invalid_rubric_score: float | None = field(default=None, metadata={"help": "Rubric reward of an invalid rubric."})
    verifier: str | None = field(
        default=None, metadata={"help": "Import path of a function returning an EvalVerifier (evaluation only)."}
    )
    guard_steps: int = field(default=0, metadata={"help": "Reward-hacking guard: probe every this many steps."})
    guard_accuracy_drop: float = field(default=0.05, metadata={"help": "Probe accuracy drop that triggers the guard."})
    guard_action: str = field(
        default="stop", metadata={"help": "What the guard does.", "choices": ["stop", "rollback"]}
    )

    def __post_init__(self):
        if self.judge_url is None and self.judge_model is None and not self.judge_panel_urls:
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
        from trl_es.evolm import HFJudge, JudgePanel, OpenAIJudge

        key = self.judge_api_key_env
        if self.judge_panel_urls:
            judges = [OpenAIJudge(url, model=self.judge_model, api_key_env=key) for url in self.judge_panel_urls]
            return JudgePanel(judges, reduce=self.judge_panel_reduce)
        if self.judge_url is not None:
            return OpenAIJudge(self.judge_url, model=self.judge_model, api_key_env=key)
        return HFJudge(self.judge_model, mode=self.judge_mode)

    def evolm_settings(self) -> dict:
        """The `EvolmConfig` fields these arguments set (beyond the roles' configs)."""
        import json

        from trl_es.trainer.config_checks import import_function

        names = ("schedule", "rounds", "question_column", "rubric_reward", "replay_min_age", "replay_max_age")
        names += (
            "max_judge_failure_rate",
            "live_rubrics",
            "rubric_temperature",
            "answer_temperature",
            "inference_temperature",
        )
        names += ("rubric_reward_weight", "format_reward_weight", "invalid_rubric_score")
        names += ("guard_steps", "guard_accuracy_drop", "guard_action")
        settings = {name: getattr(self, name) for name in names}
        if self.pair_weights is not None:
            weights = self.pair_weights
            settings["pair_weights"] = json.loads(weights) if isinstance(weights, str) else dict(weights)
        if self.verifier is not None:
            settings["verifier"] = import_function(self.verifier, "verifier")()
        return settings


def main(script_args, evolm_args, training_args, model_args, dataset_args):
    from trl_es.evolm import EvolmConfig, EvolmTrainer

    check_model(model_args)
    training_args.model_init_kwargs = model_init_kwargs(model_args, training_args)
    train_dataset, _ = load_datasets(script_args, dataset_args, seed=training_args.seed, with_eval=False)
    config = EvolmConfig(
        output_dir=training_args.output_dir,
        policy_args=evolm_args.role_config(training_args, "policy"),
        rubric_args=evolm_args.role_config(training_args, "rubric"),
        seed=training_args.seed,
        **evolm_args.evolm_settings(),
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
