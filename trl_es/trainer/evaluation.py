"""How ESTrainer evaluates: the centre of the population (never a perturbed member), generated with the training
backend and settings and scored like GRPO scores it (`eval_reward`, `eval_rewards/*`, `eval_completions/*`), plus
`eval_loss` = -`eval_reward` and, with `eval_ks`, its coverage (`eval_pass@k`, `eval_maj@k`, `eval_greedy_accuracy`,
`eval_entropy`)."""

from __future__ import annotations

import math

from ..backends.base import PhaseTimer
from ..compat.trl import calculate_rewards, logged_metrics, set_reward_environments, take_reward_logs
from ..core.fitness import weighted_rewards
from ..core.noise import sampling_seed
from ..evaluation.coverage import BackendSampler, Sampler, TransformersSampler
from ..evaluation.trainer_coverage import measure_trainer
from .rollouts import check_prompts_fit, decode_completions, tokenize_prompts
from .scoring import MemberCompletions
from .step_logging import log_completion_lengths, log_rewards, log_tool_calls, mean_or_none


def evaluate_center_batch(trainer, inputs: list[dict]) -> None:
    """Generate the centre's completions of one eval batch (its whole rollouts, with agents) and log GRPO's eval
    metrics for them."""
    # One seed for every evaluation of the run: each checkpoint samples, and resets its environments, as the others
    # did, so evaluations compare the weights on the same episodes (common random numbers across checkpoints).
    seed = sampling_seed(trainer.args.seed, "eval")
    if trainer.agents.active:
        generated = trainer.agents.generate(trainer, [None], [0], inputs, seed, PhaseTimer())
        completions = generated.completions[0]
        set_reward_environments(trainer, generated.environments[0] if generated.environments else None)
        inputs = generated.inputs[0]
    else:
        prompts = [example["prompt"] for example in inputs]
        template, template_kwargs = trainer.chat_template, trainer.chat_template_kwargs
        prompt_ids = tokenize_prompts(trainer.processing_class, prompts, template, template_kwargs)
        check_prompts_fit(prompts, prompt_ids, trainer.args.max_completion_length, trainer.context_length)
        completion_ids = trainer.population.backend.generate_center(prompt_ids, trainer.sampling, seed)
        generated = MemberCompletions.of_one_turn(prompts, prompt_ids, [completion_ids])
        completions = decode_completions(trainer.processing_class, prompts, prompt_ids, completion_ids)
    prompts, completion_ids = generated.prompts[0], generated.completion_ids[0]
    rewards_per_func = calculate_rewards(trainer, inputs, prompts, completions, completion_ids)
    take_reward_logs(trainer)  # `log_metric` of reward functions counts in training only
    metrics = logged_metrics(trainer, "eval")
    log_rewards(
        metrics,
        trainer.reward_func_names,
        rewards_per_func,
        weighted_rewards(rewards_per_func, trainer.reward_weights),
    )
    log_completion_lengths(trainer.accelerator, trainer.state, metrics, trainer.tokens.end_ids, generated, False)
    if trainer.agents.uses_tools:
        log_tool_calls(trainer.accelerator, metrics, generated)


def eval_loss(rewards: list[float]) -> float | None:
    """-`eval_reward` over an evaluation's batches (averaged as GRPO's `log` averages them, NaN batches left out),
    the training loss's meaning, so `load_best_model_at_end` and early stopping work with their default metric; None
    when no eval completion was scored."""
    return mean_or_none([-reward for reward in rewards if not math.isnan(reward)])


def center_sampler(trainer) -> Sampler:
    """The sampler coverage evaluation measures the centre with: the vLLM backend when training generates with one
    (which holds the centre between steps), `model.generate` otherwise."""
    if not trainer.use_vllm:
        return TransformersSampler(trainer.accelerator.unwrap_model(trainer.model), trainer.processing_class)
    return BackendSampler(trainer.population.backend, trainer.sampling)


def coverage_metrics(trainer, dataset, prefix: str) -> dict[str, float]:
    """The centre's coverage on `dataset` with the config's `eval_ks`, under `<prefix>_<metric>` names."""
    args = trainer.args
    if not hasattr(dataset, "__len__"):
        raise NotImplementedError(
            "eval_ks measures coverage on a map-style eval_dataset (one with a length); this one is iterable. Pass a "
            "`datasets.Dataset`, or unset eval_ks."
        )
    sampler = center_sampler(trainer)
    report = measure_trainer(
        trainer,
        sampler,
        dataset,
        args.eval_ks,
        trainer.answer_extractor,
        success_threshold=args.success_reward_threshold,
        temperature=args.eval_temperature,
        seed=args.seed,
    )
    return {f"{prefix}_{name}": value for name, value in report.as_dict().items()}
