"""The EVOLM demo's settings and its embedded models (light to import: the CLI reads the defaults)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

MODELS_DIR = Path(__file__).parent
JUDGE_MODEL = MODELS_DIR / "judge"
DEMO_MODELS = {"joint": MODELS_DIR / "joint", "null": MODELS_DIR / "null"}
PASS_AT_K = (1, 4, 16)


@dataclass(frozen=True)
class EvolmDemoSettings:
    """The demo's EVOLM run and held-out evaluation; `trl-es evolm-demo` runs `EVOLM_DEMO`, the defaults."""

    policy_method: str = "es"  # how the policy phases train: "es" or "grpo"
    rubric_method: str = "es"  # how the rubric phases train
    schedule: str = "coevolve"
    rounds: int = 2
    policy_steps: int = 20  # steps of every policy phase
    rubric_steps: int = 10  # steps of every rubric phase
    pair_weights: dict[str, float] = field(default_factory=lambda: {"temporal": 1.0})
    # The judge's scores are expected values (log-probability scoring), never exactly tied: under the indicator
    # 1[J+ > J-] a rubric that separates nothing would still win half its pairs by noise; the margin J+ - J- is ~0.
    rubric_reward: str = "margin"
    # What the phases sample rubrics and inferred questions at, and the format reward's weight: the authors' (as
    # EvolmConfig's defaults); the gates measure the rubrics at this temperature.
    rubric_temperature: float = 0.6
    inference_temperature: float = 0.3
    format_reward_weight: float = 0.0
    kl_anchor_beta: float = 0.0  # ES phases: hold both roles near the phase start (ESConfig.kl_anchor_beta)
    live_rubrics: bool = False  # policy phases read rubrics the trained model writes at every step
    # ES: every member answers the same `prompts_per_step` questions greedily (a policy step), or writes a rubric for
    # the same `rubric_prompts_per_step` questions (a rubric step: rubrics are 6x longer than answers, so fewer).
    population_size: int = 16
    prompts_per_step: int = 32
    rubric_population_size: int = 8
    rubric_prompts_per_step: int = 16
    sigma: float = 0.02
    learning_rate: float = 0.02
    # GRPO: the same completions per step as ES (population size x prompts per step), `num_generations` samples of
    # each question at temperature 1.
    num_generations: int = 8
    grpo_learning_rate: float = 3e-3  # the coverage lab's choice for a model of this size (docs/lab.md)
    max_completion_length: int = 32  # a rubric is 22 tokens
    num_train: int = 256  # training questions
    num_held_out: int = 512  # held-out test problems, never trained on
    eval_seed: int = 1234
    # An evaluation-only verifier (`toy.eval_verifier`) on the training questions and this many test problems after
    # the first `num_held_out`: every phase then logs accuracies, the net signal and the pair balance; 0: none.
    verifier_probe_size: int = 0

    def completions_per_step(self, role: str) -> int:
        """Completions of one step of `role` ("policy" or "rubric"), ES or GRPO alike."""
        if role == "policy":
            return self.population_size * self.prompts_per_step
        return self.rubric_population_size * self.rubric_prompts_per_step

    def role_config(self, role: str, output_dir: str, max_steps: int, seed: int):
        """The ESConfig or GRPOConfig (as `policy_method` / `rubric_method` say) of one role's phases: on CPU, no
        checkpoints, no reporting."""
        method = self.policy_method if role == "policy" else self.rubric_method
        population_size = self.population_size if role == "policy" else self.rubric_population_size
        common = dict(
            output_dir=output_dir,
            max_steps=max_steps,
            max_completion_length=self.max_completion_length,
            logging_steps=max(1, max_steps // 2),
            save_strategy="no",
            report_to=[],
            seed=seed,
            use_cpu=True,
            disable_tqdm=True,
        )
        if method == "es":
            from ...trainer.es_config import ESConfig

            return ESConfig(
                population_size=population_size,
                sigma=self.sigma,
                learning_rate=self.learning_rate,
                per_device_train_batch_size=self.completions_per_step(role) // population_size,
                temperature=0.0,  # greedy: ES explores in weight space
                kl_anchor_beta=self.kl_anchor_beta,
                **common,
            )
        if method == "grpo":
            from trl import GRPOConfig

            return GRPOConfig(
                per_device_train_batch_size=self.completions_per_step(role),
                num_generations=self.num_generations,
                learning_rate=self.grpo_learning_rate,
                temperature=1.0,
                bf16=False,
                **common,
            )
        raise ValueError(f"Unknown method={method!r}; use 'es' or 'grpo'.")

    def evolm_config(self, output_dir: str, seed: int = 0):
        from ...evolm.config import EvolmConfig
        from ...tasks.arithmetic import problem
        from .toy import DEMO_PROMPTS, DEMO_RULES, eval_verifier

        verifier = None
        if self.verifier_probe_size:
            trained = [problem("train", index) for index in range(self.num_train)]
            probe = [problem("test", self.num_held_out + index) for index in range(self.verifier_probe_size)]
            verifier = eval_verifier(trained, probe)

        return EvolmConfig(
            output_dir=output_dir,
            policy_args=self.role_config("policy", output_dir, self.policy_steps, seed),
            rubric_args=self.role_config("rubric", output_dir, self.rubric_steps, seed),
            schedule=self.schedule,
            rounds=self.rounds,
            rubric_reward=self.rubric_reward,
            rubric_temperature=self.rubric_temperature,
            inference_temperature=self.inference_temperature,
            format_reward_weight=self.format_reward_weight,
            live_rubrics=self.live_rubrics,
            pair_weights=self.pair_weights,
            # Temporal pairs compare the current answers with those of one or two policy phases before.
            replay_min_age=self.policy_steps,
            replay_max_age=self.rounds * self.policy_steps,
            seed=seed,
            rubric_rules=DEMO_RULES,
            prompts=DEMO_PROMPTS,
            verifier=verifier,
        )


EVOLM_DEMO = EvolmDemoSettings()


def with_overrides(settings: EvolmDemoSettings = EVOLM_DEMO, **overrides) -> EvolmDemoSettings:
    """`settings` with the fields in `overrides` that are not None replaced."""
    return replace(settings, **{name: value for name, value in overrides.items() if value is not None})
