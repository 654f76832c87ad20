"""What a coverage-lab run depends on: the methods, the k's and sparsities measured, and `LabSettings` (saved in the
results file), with the budget arithmetic that gives ES and GRPO the same number of completions or, with
`equal="seconds"`, the same measured training seconds."""

from __future__ import annotations

from dataclasses import dataclass, field

from trl_es.demo.run import DEMO, PASS_AT_K

METHODS = ("base", "es", "grpo", "es-then-grpo", "grpo-then-es")
LABELS = {"base": "base", "es": "ES", "grpo": "GRPO", "es-then-grpo": "ES→GRPO", "grpo-then-es": "GRPO→ES"}
ALL_KS = tuple(range(1, 17))
MAJ_KS = (1, 2, 4, 16)  # Maj@8 is left out: 10,000 sampled 8-subsets per problem cost more than the rest of an eval
SPARSITY_PERCENTS = (50, 78, 90)
WORKERS = 2  # worker processes of a full run (one with --quick)
EQUAL = ("completions", "seconds")
CALIBRATION_STEPS = 6  # per method: the first step warms up, the other 5 give the seconds per step


@dataclass
class LabSettings:
    """Everything a lab run depends on; saved in the JSON. Defaults are the full run."""

    seeds: tuple[int, ...] = (0, 1, 2)
    # ES: the demo's settings (`trl_es.demo.run.DEMO`), but 3/10 of its steps by default: at the demo's budget one
    # GRPO run costs ~25 min on one thread of our 2-core machine (3.8 s per 512-completion step), too long for
    # 3 seeds x 4 trained methods in the lab's ~40 min.
    es_steps: int = DEMO.max_steps * 3 // 10
    population_size: int = DEMO.population_size
    sigma: float = DEMO.sigma
    es_learning_rate: float = DEMO.learning_rate
    # ES settings changed from the demo's (an ablation variant, `experiments.es_ablation.settings.VARIANTS`)
    es_variant: str = "default"
    es_overrides: dict = field(default_factory=dict)
    prompts_per_step: int = DEMO.prompts_per_step
    max_completion_length: int = DEMO.max_completion_length
    # GRPO: `prompts_per_step` prompts x `num_generations` samples at temperature 1; steps follow from the budget.
    num_generations: int = 8
    grpo_learning_rate: float | None = None  # None: chosen by the sweep below, on training reward only
    # Wide enough that the best rate is inside the grid, not at its edge (3e-3, the old grid's top, won it).
    grpo_lr_sweep: tuple[float, ...] = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2)
    sweep_steps: int = 20  # steps of each sweep run (with the full run's schedule), judged on their last 10 rewards
    # Held-out evaluation (the test split, never trained on), as the demo's.
    num_held_out: int = DEMO.num_held_out
    samples_per_prompt: int = max(PASS_AT_K)
    num_sparse_held_out: int = 256
    js_problems: int = 64
    js_samples: int = 8
    js_population: int = 16
    num_train: int = DEMO.num_train
    logging_steps: int = 5
    eval_seed: int = DEMO.eval_seed
    # "completions": every method spends `budget` completions. "seconds": every method trains for the CPU seconds GRPO
    # needs for that budget; `grpo_steps_fixed` and `es_steps` are then set from the measured seconds per step.
    equal: str = "completions"
    grpo_steps_fixed: int | None = None
    seconds_per_step: dict[str, float] | None = None  # measured by the calibration job (equal="seconds")

    @property
    def es_generations(self) -> int:
        return self.es_overrides.get("num_generations", 1)

    @property
    def completions_per_es_step(self) -> int:
        population = self.es_overrides.get("population_size", self.population_size)
        return population * self.prompts_per_step * self.es_generations

    @property
    def completions_per_grpo_step(self) -> int:
        return self.prompts_per_step * self.num_generations

    @property
    def budget(self) -> int:
        """Completions per method and seed."""
        return self.es_steps * self.completions_per_es_step

    @property
    def grpo_steps(self) -> int:
        if self.grpo_steps_fixed is not None:
            return self.grpo_steps_fixed
        steps, remainder = divmod(self.budget, self.completions_per_grpo_step)
        if remainder or self.es_steps % 2 or steps % 2:
            raise ValueError(
                f"The budget of {self.budget} completions does not split into whole, even numbers of ES steps "
                f"({self.completions_per_es_step} completions) and GRPO steps ({self.completions_per_grpo_step})."
            )
        return steps


def equal_seconds(settings: LabSettings, seconds_per_step: dict[str, float]) -> LabSettings:
    """`settings` with steps that give every method the training seconds GRPO spends on the completion budget:
    GRPO keeps its steps, ES gets as many (even) steps as those seconds buy at its measured seconds per step."""
    from dataclasses import replace

    grpo_steps = settings.grpo_steps
    seconds = grpo_steps * seconds_per_step["grpo"]
    es_steps = max(2, 2 * round(seconds / seconds_per_step["es"] / 2))
    return replace(
        settings, equal="seconds", grpo_steps_fixed=grpo_steps, es_steps=es_steps, seconds_per_step=seconds_per_step
    )


def quick_settings(seeds: tuple[int, ...] = (0,)) -> LabSettings:
    """A smoke-test lab: a few steps and problems, to check the pipeline end to end in a minute or two."""
    return LabSettings(
        seeds=seeds,
        es_steps=2,
        population_size=4,
        prompts_per_step=8,
        num_generations=4,
        grpo_lr_sweep=(1e-4, 1e-3),
        sweep_steps=1,
        num_held_out=16,
        num_sparse_held_out=8,
        js_problems=4,
        js_samples=4,
        js_population=4,
        num_train=64,
        logging_steps=1,
    )
