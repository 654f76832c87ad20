"""What an ablation run depends on: the variants (one knob changed from the demo's settings each), the equal
completion budget that gives each its number of steps, and the measurements; `AblationSettings` is saved in the
results file."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from trl_es.demo.run import DEMO


@dataclass(frozen=True)
class Variant:
    """One setting of one knob: `overrides` are the ESConfig fields it changes from the defaults (the demo's), and
    `prompts_per_step` the prompts of a step where it differs (a variant that samples several completions per prompt
    answers fewer prompts, so that its steps cost what a default step does)."""

    knob: str
    label: str
    overrides: dict = field(default_factory=dict)
    prompts_per_step: int | None = None


DEFAULT = "default"
# Momentum's running sum is about 1 / (1 - beta) = 10 directions, Adam's entries about sqrt(N) = 4 times plain ES's:
# their learning rates are scaled to take steps of the default's size (no learning rate was tuned).
VARIANTS = {
    DEFAULT: Variant("defaults", "default (N=16, σ=0.02, z-score, one-point, SGD)"),
    "n8": Variant("population size", "N=8", {"population_size": 8}),
    "n32": Variant("population size", "N=32", {"population_size": 32}),
    "n64": Variant("population size", "N=64", {"population_size": 64}),
    "sigma0.01": Variant("sigma", "σ=0.01", {"sigma": 0.01}),
    "sigma0.04": Variant("sigma", "σ=0.04", {"sigma": 0.04}),
    "centered-rank": Variant("fitness shaping", "centred ranks", {"fitness_shaping": "centered_rank"}),
    "no-shaping": Variant("fitness shaping", "none (mean-centred)", {"fitness_shaping": "none"}),
    "per-prompt": Variant("fitness shaping", "per-prompt z-score", {"normalize_fitness_per_prompt": True}),
    "two-point": Variant("estimator", "two-point (antithetic)", {"antithetic": True}),
    "momentum": Variant("optimizer", "momentum 0.9 (α×0.1)", {"es_optimizer": "momentum", "learning_rate": 0.002}),
    "adam": Variant("optimizer", "Adam (α/√N)", {"es_optimizer": "adam", "learning_rate": 0.005}),
    "sigma-cosine": Variant(
        "sigma control", "cosine σ: 0.02 → 0.005", {"sigma_schedule": "cosine", "sigma_final": 0.005}
    ),
    "sigma-adaptive": Variant("sigma control", "adaptive σ, JS target 0.3", {"sigma_target_js_diversity": 0.3}),
    "pass-at-4": Variant(
        "fitness",
        "Pass@4 of 4 samples (T=1), 16 prompts",
        {"fitness_pass_at_k": 4, "num_generations": 4, "temperature": 1.0},
        prompts_per_step=16,
    ),
}
KNOBS = tuple(dict.fromkeys(variant.knob for variant in VARIANTS.values() if variant.knob != "defaults"))
PASS_KS = (1, 4, 16)


@dataclass
class AblationSettings:
    """Everything an ablation run depends on; saved in the JSON. Defaults are the full run (15 variants x 3 seeds,
    about 50 min with 2 workers on 2 CPU cores)."""

    seeds: tuple[int, ...] = (0, 1, 2)
    variants: tuple[str, ...] = tuple(VARIANTS)
    # Completions per run: 40 default steps (16 members x 64 prompts), two thirds of the coverage lab's ES budget.
    budget: int = 40 * DEMO.population_size * DEMO.prompts_per_step
    prompts_per_step: int = DEMO.prompts_per_step
    max_completion_length: int = DEMO.max_completion_length
    num_train: int = DEMO.num_train
    num_train_eval: int = 256  # training problems whose greedy accuracy chooses a setting
    num_held_out: int = DEMO.num_held_out  # test problems, reported only
    samples_per_prompt: int = max(PASS_KS)
    logging_steps: int = 5
    eval_seed: int = DEMO.eval_seed
    bootstrap_draws: int = 2000

    def prompts_of(self, variant: Variant) -> int:
        return variant.prompts_per_step or self.prompts_per_step

    def completions_per_step(self, variant: Variant) -> int:
        population = variant.overrides.get("population_size", DEMO.population_size)
        return population * self.prompts_of(variant) * variant.overrides.get("num_generations", 1)

    def steps(self, variant: Variant) -> int:
        """Steps that spend the budget (the last step may overspend it by less than one step)."""
        return math.ceil(self.budget / self.completions_per_step(variant))


def quick_settings(seeds: tuple[int, ...] = (0,), variants: tuple[str, ...] = (DEFAULT, "n8")) -> AblationSettings:
    """A smoke test: a few steps and problems, to check the pipeline end to end in a minute."""
    return AblationSettings(
        seeds=seeds,
        variants=variants,
        budget=2 * 16 * 8,
        prompts_per_step=8,
        num_train=64,
        num_train_eval=8,
        num_held_out=8,
        samples_per_prompt=4,
        logging_steps=1,
        bootstrap_draws=200,
    )
