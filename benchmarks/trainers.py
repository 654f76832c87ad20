"""The trainers the benchmarks measure: ES and GRPO built with equal settings on the token reward, and what is timed of
an ES step (the step itself, its logged phases, its own work besides generation)."""

from __future__ import annotations

import tempfile

from benchmarks.harness import median, timed

ES_PHASES = ("perturb", "generate", "reward", "update")


def even_token_fraction(completion_ids, **kwargs) -> list[float]:
    """Reward: the fraction of even token ids in each completion. Dense (members' fitness differs, so the update is
    never zero) and defined for any vocabulary, also ids the local tokenizer cannot decode."""
    return [sum(1 - token % 2 for token in ids) / len(ids) if ids else 0.0 for ids in completion_ids]


def make_trainer(method: str, model, population_size: int, batch_size: int, max_completion_length: int, steps: int,
                 cpu: bool, callbacks=(), grpo_micro_batch: int | None = None, **es_overrides):  # fmt: skip
    """An ESTrainer (population N, B prompts) or a GRPOTrainer (B prompts x N completions) with equal settings.

    GRPO trains `grpo_micro_batch` completions per forward and backward (default: all N x B in one), accumulating
    gradients over the step; it generates the step's N x B completions in one call either way."""
    from trl import GRPOConfig, GRPOTrainer

    from trl_es import ESConfig, ESTrainer
    from trl_es.testing import digit_prompts

    common = dict(
        output_dir=tempfile.mkdtemp(prefix="trl-es-bench-"),
        max_completion_length=max_completion_length,
        generation_kwargs={"min_new_tokens": max_completion_length},  # equal work: no completion stops early
        temperature=1.0,
        bf16=False,  # the model's own dtype decides: float32 or bf16 weights, no autocast
        use_cpu=cpu,
        max_steps=steps,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
    )
    if method == "es-lowrank":
        method, es_overrides = "es", {"perturbation": "lowrank", **es_overrides}
    if method == "es":
        # sigma well above the 0.02 weight scale, so members write different completions
        args = ESConfig(population_size=population_size, per_device_train_batch_size=batch_size, sigma=0.05,
                        learning_rate=0.01, **{**common, **es_overrides})  # fmt: skip
        trainer_class = ESTrainer
    else:  # GRPO's defaults otherwise: AdamW, gradient checkpointing, beta=0
        completions = population_size * batch_size
        micro_batch = min(grpo_micro_batch or completions, completions)
        if completions % micro_batch:
            raise SystemExit(f"--grpo_micro_batch {micro_batch} must divide the N x B = {completions} completions.")
        args = GRPOConfig(per_device_train_batch_size=micro_batch, num_generations=population_size,
                          gradient_accumulation_steps=completions // micro_batch, **common)  # fmt: skip
        trainer_class = GRPOTrainer
    dataset = digit_prompts(batch_size * steps)
    trainer = trainer_class(
        model=model, reward_funcs=even_token_fraction, args=args, train_dataset=dataset, callbacks=list(callbacks)
    )
    return quiet(trainer)


def quiet(trainer):
    """`trainer` without the Trainer's printer, which `disable_tqdm` puts in the progress bar's place and which would
    print every step's log dict into the benchmark's table (the measurements read `state.log_history`)."""
    from transformers import PrinterCallback

    trainer.remove_callback(PrinterCallback)
    return trainer


def warmed_up_es(model_path: str, population_size: int, batch_size: int, tokens: int, device: str, **es_overrides):
    """An ESTrainer after one step through the Trainer loop (which creates the master), and its prompt batch."""
    from trl_es.testing import digit_prompts

    trainer = make_trainer("es", model_path, population_size, batch_size, tokens, steps=1, cpu=device == "cpu",
                           **es_overrides)  # fmt: skip
    trainer.train()
    return trainer, list(digit_prompts(batch_size)["prompt"])


def es_step_seconds(trainer, prompts: list[str]) -> float:
    """One whole ES step on `prompts` (perturb, generate, score, update), outside the Trainer loop."""
    return timed(trainer._es_step, [{"prompt": prompt} for prompt in prompts], device=trainer.model.device)


def es_phases(trainer, repetitions: int) -> dict:
    """Medians of the phases the last `repetitions` ES steps logged, and how many of them updated nothing."""
    from trl_es.compat.trl import logged_metrics

    recorded = logged_metrics(trainer, "train")
    phases = {phase: median(recorded[f"es/time/{phase}"][-repetitions:]) for phase in ES_PHASES}
    phases["zero_update_steps"] = sum(norm == 0 for norm in recorded["es/update_norm"][-repetitions:])
    return phases


def es_own_work_seconds(trainer, step_seconds: list[float]) -> float:
    """The median of (ES step - its generation phase) over the last `len(step_seconds)` steps. On a loaded machine the
    generation calls of an ES step and of its baseline vary by more than ES's own work, so a ratio built from this is
    steadier than the direct one (it assumes the ES step generates as fast as the baseline, which the direct ratio
    checks)."""
    from trl_es.compat.trl import logged_metrics

    generated = logged_metrics(trainer, "train")["es/time/generate"][-len(step_seconds) :]
    return median([step - phase for step, phase in zip(step_seconds, generated, strict=True)])
