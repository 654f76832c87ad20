"""One ablation run: train ES with one variant for one seed, then measure the centre on training problems (what a
setting is chosen on) and on held-out problems (what is reported). Each run is a job of `experiments.harness.run_jobs`,
cached in the work folder."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

from experiments.es_ablation.settings import VARIANTS, AblationSettings
from experiments.harness import cached_job
from trl_es.demo.run import DEMO, DEMO_MODEL


@dataclass
class Job:
    variant: str
    seed: int
    work_dir: str
    settings: AblationSettings = field(default_factory=AblationSettings)
    threads: int = 1

    @property
    def name(self) -> str:
        return f"{self.variant}-seed{self.seed}"


def run_job(job: Job) -> dict:
    return cached_job(Path(job.work_dir) / job.name, lambda: train_and_measure(job), job.threads)


def es_config(settings: AblationSettings, variant_name: str, output_dir: str, seed: int):
    """The demo's ESConfig (greedy, on CPU, no checkpoints) for the variant's steps and prompts, with its changes."""
    variant = VARIANTS[variant_name]
    generations = variant.overrides.get("num_generations", 1)
    demo = replace(
        DEMO,
        max_steps=settings.steps(variant),
        prompts_per_step=settings.prompts_of(variant) * generations,  # completions per member and step
        max_completion_length=settings.max_completion_length,
        logging_steps=settings.logging_steps,
    )
    return demo.es_config(output_dir, seed, disable_tqdm=True, **variant.overrides)


def train_and_measure(job: Job) -> dict:
    from trl_es import ESTrainer
    from trl_es.tasks.arithmetic import arithmetic_dataset, arithmetic_reward

    settings = job.settings
    config = es_config(settings, job.variant, str(Path(job.work_dir) / job.name / "run"), job.seed)
    trainer = ESTrainer(
        model=str(DEMO_MODEL),
        reward_funcs=arithmetic_reward,
        args=config,
        train_dataset=arithmetic_dataset("train", settings.num_train),
    )
    trainer.train()
    model, tokenizer = trainer.model, trainer.processing_class
    history = trainer.state.log_history
    return {
        "steps": trainer.state.global_step,
        "completions": trainer.state.global_step * settings.completions_per_step(VARIANTS[job.variant]),
        "train": measure(settings, model, tokenizer, "train", settings.num_train_eval, samples=0),
        "held_out": measure(settings, model, tokenizer, "test", settings.num_held_out, settings.samples_per_prompt),
        "curve": {key: [entry[key] for entry in history if key in entry] for key in ("reward", "es/sigma")},
        "js_diversity": [entry["es/js_diversity"] for entry in history if "es/js_diversity" in entry],
    }


def measure(settings: AblationSettings, model, tokenizer, split: str, num_problems: int, samples: int) -> dict:
    """Per problem of the first `num_problems` of `split`: greedy correctness and, with `samples`, the number of
    correct samples at temperature 1 (from the demo's evaluation seed)."""
    from trl_es.evaluation.coverage import TransformersSampler, answer_judge, completion_entropy, measure_prompts
    from trl_es.tasks.arithmetic import arithmetic_dataset, extract_answer

    data = arithmetic_dataset(split, num_problems)
    prompt_ids = [tokenizer(prompt, add_special_tokens=False)["input_ids"] for prompt in data["prompt"]]
    outcomes = measure_prompts(
        TransformersSampler(model, tokenizer),
        partial(completion_entropy, model),
        tokenizer,
        prompt_ids,
        answer_judge(list(data["answer"]), extract_answer),
        max(samples, 1),
        temperature=1.0,
        max_new_tokens=settings.max_completion_length,
        seed=settings.eval_seed,
    )
    measured = {"greedy_correct": [float(outcome.greedy_correct) for outcome in outcomes]}
    if samples:
        measured["correct_samples"] = [sum(outcome.correct) for outcome in outcomes]
    return measured
