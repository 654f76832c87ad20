"""ESTrainer: GRPOTrainer's interface, trained with Evolution Strategies instead of a policy gradient.

One ES step (`_es_step`) reads like the method: the step's members, their completions from the backend, the rewards,
the fitness and its shaping, the update of the centre. The rest of the class wires the Trainer's hooks to modules of
their own: the population (`trainer_population.py`), which processes hold the model (`released_model.py`), scoring
(`scoring.py`), what a step cannot do (`divergence.py`), logging (`step_logging.py`), checkpoints and resume
(`resume.py`), evaluation (`evaluation.py`), the Hub (`hub.py`).
The ES math lives in `trl_es/core/`, the ways of generating with members in `trl_es/backends/` (chosen once, by
`build_population`), and every use of a library's private API in `trl_es/compat/`. (The class docstring is
ESTrainer's API reference page, which is most of the file's length.)
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from trl import GRPOConfig, GRPOTrainer

from ..backends.base import PhaseTimer
from ..backends.hf import TokenIds
from ..backends.population import Population, engine_setup
from ..backends.sampling import SamplingSettings
from ..compat.accelerate import prepare_without_ddp
from ..compat.deepspeed import release_process_groups
from ..compat.transformers import TrainerHooks
from ..compat.trl import (
    TrainerTags,
    completion_table,
    grpo_init_sees_defaults,
    logged_metrics,
)
from ..core.distributed import (
    Evaluators,
    check_ranks_agree,
    whole_batch,
)
from ..core.fitness import (
    any_scored,
    member_fitness,
    objective_rewards,
    shape_fitness,
    update_coefficients,
    weighted_rewards,
)
from ..core.guards import check_fitness
from ..core.noise import population as population_members
from ..core.noise import sampling_seed
from ..evaluation.coverage import Sampler
from ..evaluation.metrics import StartingWeights
from . import evaluation, hub, kl_probe, resume, step_logging
from .agent_rollouts import AgentRollouts
from .checkpoint_hooks import CheckpointHooks
from .config_checks import check_again_at_train, engine_group_size
from .divergence import (
    StepCounters,
    degenerate_steps_warning,
    divergence_stops_training,
    refuse_infinite_rewards,
    truncated_step_warning,
    unscored_step_warning,
)
from .es_config import ESConfig
from .grpo_conversion import neutral_grpo_loss_values
from .inputs import as_es_config, check_datasets, check_model_fits_backend
from .kl_probe import KLProbe
from .noise_scale import NoiseScale
from .output_lock import hold_output_dir
from .preemption import stop_on_preemption
from .released_model import loads_checkpoint_weights, restore_model_weights
from .reward_checks import checked_reward_function
from .rollouts import context_length, tokenizer_of
from .sampler import EpochSeededRepeatSampler
from .scoring import generate_and_score
from .trainer_population import build_trainer_population

logger = logging.getLogger(__name__)


class ESTrainer(CheckpointHooks, TrainerHooks, TrainerTags, GRPOTrainer):
    r"""
    Trainer for Evolution Strategies (ES) post-training of language models, with the interface of [`~trl.GRPOTrainer`].

    Replace `GRPOTrainer` with `ESTrainer` (and `GRPOConfig` with [`ESConfig`]) in a GRPO script and it trains with ES:
    the constructor, the reward-function contract (`prompts`, `completions`, `completion_ids`, dataset columns,
    `trainer_state`, `log_metric`, async functions, `None` for "no score", reward models as strings,
    `reward_weights`), the generation fields and the metric names are GRPO's.

    One ES step (one optimizer step of the `Trainer` loop):

    1. draw `population_size` members `theta + sigma * eps_i`, the noise a pure function of (seed, parameter name,
       shape);
    2. every member answers the same prompt batch (`num_generations` completions per prompt, shared sampling seeds);
    3. a member's fitness is the mean of its completions' weighted rewards (standardised per prompt with
       `normalize_fitness_per_prompt`; its Pass@k over the prompts with `fitness_pass_at_k`); the fitness is shaped
       (`fitness_shaping`);
    4. `theta <- theta + learning_rate * (1/N) * sum_i z_i * eps_i`, accumulated and applied to a float32 master copy
       (through momentum or Adam with `es_optimizer`).

    Only parameters with `requires_grad=True` evolve (with `peft_config`, the adapter). No gradients, optimizer state
    or activations for backpropagation are kept, and no reference model is built: with `kl_anchor_beta`, the KL
    anchor reads the starting weights' log-probabilities of a fixed probe once, and each member's fitness is its mean
    reward minus `kl_anchor_beta` times its KL from them (the centre's is logged as `kl`).

    What ES minimises is logged under GRPO's names: `loss` is minus the members' mean fitness (`-es/fitness/mean`)
    over the logged steps, `train_loss` (and `TrainOutput.training_loss`) its mean over the run's steps, and
    `eval_loss` minus the centre's mean eval reward (`-eval_reward`), so `load_best_model_at_end` and early stopping
    work with their defaults. `grad_norm` is not logged: there is no gradient. A step whose completions no reward
    function scored (every reward `None`) makes no update, warns, and counts in `es/skipped_steps`; one whose members
    all scored the same has no update direction and counts in `es/degenerate_steps` (with a warning after
    `warn_after_degenerate_steps` in a row).

    A reward of `+-inf` is an error naming the reward function and the completion (`None` or NaN mean "no score"), and
    a step that would make the weights non-finite stops training with a `NonFiniteError` naming the step, the cause
    and the last good checkpoint, before anything is applied; no NaN is ever saved.

    With several processes generating with vLLM (colocated engines or servers, and a full-rank float32 master), only
    a process that saves checkpoints keeps the weights of `trainer.model`: the others hold empty evolving parameters,
    as DeepSpeed ZeRO-3 leaves the ones a process does not own, and get them back from the main process whenever the
    trainer loads into them or builds a population from them; coverage evaluation measures its entropies where the
    weights are held (see "Distributed training").

    One run at a time trains in an `output_dir`: `train` refuses a folder another live run holds, naming it. A
    scheduler's SIGTERM (or SLURM's early SIGUSR1) ends training after the current step with a checkpoint that
    `resume_from_checkpoint=True` resumes from; `train` then raises `TrainingPreempted`, which exits the script with
    status 128 + the signal (143 for SIGTERM); every process stops after the same step.

    Example:

    ```python
    >>> from datasets import load_dataset
    >>> from trl.rewards import accuracy_reward
    >>> from trl_es import ESConfig, ESTrainer

    >>> dataset = load_dataset("trl-lib/DeepMath-103K", split="train")
    >>> trainer = ESTrainer(
    ...     model="Qwen/Qwen2.5-0.5B-Instruct",
    ...     reward_funcs=accuracy_reward,
    ...     args=ESConfig(population_size=30, sigma=1e-3, learning_rate=5e-4),
    ...     train_dataset=dataset,
    ... )
    >>> trainer.train()
    ```

    Args:
        model, reward_funcs, train_dataset, eval_dataset, processing_class, reward_processing_classes, callbacks,
        optimizers, quantization_config, peft_config:
            As in [`~trl.GRPOTrainer`]. The optimizer is never stepped with gradients; its scheduler sets the ES step
            size from `args.learning_rate`.
        args ([`ESConfig`] or [`~trl.GRPOConfig`], *optional*):
            Configuration. A `GRPOConfig` is converted with [`ESConfig.from_grpo_config`] (with a warning), so an
            unmodified GRPO script runs after the class swap.
        kl_probe_prompts (`list`, *optional*):
            The prompts of the KL anchor's probe (text or conversations, as the dataset's `prompt` column), e.g. the
            prompts of several tasks whose behaviour the run must keep; by default the first
            `args.kl_anchor_probe_size` prompts of `train_dataset`. Only read with `args.kl_anchor_beta > 0`.
        tools, environment_factory, rollout_func:
            As in [`~trl.GRPOTrainer`] (same arguments, dataset columns, reward-function arguments such as
            `environments`, and logged `tools/*` metrics), with every member running the whole multi-turn rollout
            with its own weights, and its environments reset with the same seed as every other member's. A
            `rollout_func` is called once per member; it may take GRPO's `(prompts, trainer)` (the member's weights
            are written where it generates: `model.generate` or the colocated vLLM engine) or also a `member`
            argument, whose `member.generate(prompt_ids)` generates with the member's weights on any backend. See
            the agents section of the ES trainer docs.
    """

    model_tags = ("trl", "trl-es", "es")
    # Warn after this many steps in a row without an update direction (all members equally fit).
    warn_after_degenerate_steps = 10

    def __init__(
        self,
        model,
        reward_funcs=None,
        args: ESConfig | GRPOConfig | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        reward_processing_classes=None,
        callbacks=None,
        optimizers=(None, None),
        quantization_config=None,
        peft_config=None,
        tools: list[Callable] | None = None,
        rollout_func=None,
        environment_factory=None,
        kl_probe_prompts: list | None = None,
    ):
        args = as_es_config(args, model)
        check_model_fits_backend(args, model, peft_config)
        check_datasets(train_dataset, eval_dataset, args, environment_factory is not None)
        # GRPO's loss settings (beta: a reference model) are hidden from GRPO's constructor and kept in `args`.
        with engine_setup(args), grpo_init_sees_defaults(args, neutral_grpo_loss_values()):
            super().__init__(
                model=model,
                reward_funcs=reward_funcs,
                args=args,
                train_dataset=train_dataset,
                eval_dataset=eval_dataset,
                processing_class=processing_class,
                reward_processing_classes=reward_processing_classes,
                callbacks=callbacks,
                optimizers=optimizers,
                quantization_config=quantization_config,
                peft_config=peft_config,
                tools=tools,
                rollout_func=rollout_func,
                environment_factory=environment_factory,
            )
        release_process_groups()  # DeepSpeed, imported by the Trainer, would hold them past `destroy_process_group`
        # ES reduces no gradients: the model is never wrapped in DDP, and one kept in host memory is never moved.
        prepare_without_ddp(self.accelerator, lambda module: module is self.model, place=not args.model_in_host_memory)
        # GRPO's `tools`: the given tools and the environments' methods.
        self.agents = AgentRollouts(tools, environment_factory, rollout_func, uses_tools=bool(self.tools))
        self.agents.check_settings(args)
        self.use_vllm = args.use_vllm
        # GRPO reuses one generation batch for `num_iterations` updates; ES makes one update per prompt batch. Nor is
        # there a policy gradient to correct for vLLM's sampling.
        self.num_iterations = 1
        self.vllm_importance_sampling_correction = False
        self.sampling = SamplingSettings.from_config(args)
        self.tokens = TokenIds.of(self.model, tokenizer_of(self.processing_class))
        self.context_length = context_length(self.model, args)  # prompt + completion tokens generation can hold
        self.answer_extractor = args.answer_extractor()
        self._population: Population | None = None
        self._kl_probe_prompts = kl_probe_prompts
        self._kl_probe: KLProbe | None = None  # with kl_anchor_beta, sampled from the starting weights
        # The run's starting weights, on disk (not in memory) in the process that logs and saves: es/param_distance
        self._reference: StartingWeights | None = None
        self._resumed: resume.ResumedRun | None = None
        self._micro_step = 0
        self._losses = step_logging.LossLog()
        self._counters = StepCounters()
        self._noise_scale = NoiseScale(args)
        # A wrong return type is an error naming the function; None and NaN rewards are counted to report which.
        self._unscored = Counter()
        self.reward_funcs = [
            func if isinstance(func, torch.nn.Module) else checked_reward_function(func, name, self._unscored)
            for func, name in zip(self.reward_funcs, self.reward_func_names, strict=True)
        ]

    @property
    def population(self) -> Population:
        """The run's population: the float32 master (the centre, with sigma) and the backend that evaluates members.
        Built from the model's current weights (or the resumed checkpoint's) when first needed."""
        if self._population is None:
            self._population = build_trainer_population(self, self._resumed)
            if self._reference is None and self.args.should_save:
                self._reference = StartingWeights.write(self._population.parameters)
            if self.args.kl_anchor_beta:
                self._kl_probe = kl_probe.sample_trainer_probe(self, self._resumed)
            # The population holds what it needs of the checkpoint; keeping the rest would hold every process's copy
            # of its masters and starting weights for the whole run, and rebuild a released population from them.
            self._resumed = None
        return self._population

    @property
    def evaluators(self) -> Evaluators:
        """Who evaluates which member: each process, or each group of processes that share a tensor-parallel
        engine."""
        return Evaluators.of(self.accelerator, engine_group_size(self.args))

    def release_population(self) -> None:
        """Drop the population (and the engine model its backend holds); the next use builds it again from the model's
        weights (a master's digits below the model's dtype are not kept)."""
        self._population = None

    def wrap_train_sampler(self, sampler):
        return EpochSeededRepeatSampler.like(sampler)

    # ------------------------------------------------------------------------------------------------------------
    # The ES step

    def training_step(self, model, inputs, num_items_in_batch=None) -> torch.Tensor:
        # As in `Trainer.training_step`: GRPO's metrics are filed under "train" only while the model is in train mode.
        model.train()
        # GRPO's sampler repeats each generation batch `gradient_accumulation_steps` times; the ES step runs on the
        # first copy and the repeats are the same prompts. The Trainer sums the returned losses over those
        # micro-steps, so only the ES step's returns its loss, -mean fitness (`log` reports the same values from
        # `_losses`, leaving out steps without a fitness).
        loss = torch.zeros((), device=self.args.device)
        if self._micro_step % self.args.gradient_accumulation_steps == 0:
            start = time.perf_counter()
            fitness = self._es_step(whole_batch(self.accelerator, inputs))
            logged_metrics(self, "train")["step_time"].append(time.perf_counter() - start)
            if fitness is not None:
                self._losses.add(fitness)
                loss = -fitness.mean().to(loss)
        self._micro_step += 1
        return loss

    @torch.no_grad()
    def _es_step(self, inputs: list[dict[str, Any]]) -> torch.Tensor | None:
        """One ES step on the step's whole prompt batch: members -> completions -> rewards -> fitness -> update.
        Returns the members' fitness, or None for a step that no reward function scored (no update)."""
        args, step, timer = self.args, self.state.global_step, PhaseTimer()
        population = self.population
        population.master.sigma = self._noise_scale.of_step(step, self.state.max_steps)  # members are drawn with it
        logged_metrics(self, "train")["es/sigma"].append(population.master.sigma)
        members = population_members(args.member_noise_seed, step, args.population_size, args.antithetic)
        # Every member answers the same prompts; with sampling, row j of every member uses the same seed.
        self._unscored.clear()  # None and NaN rewards of this step, counted by the checked reward functions
        generated, scores = generate_and_score(
            self, inputs, members, sampling_seed(args.member_noise_seed, step), timer
        )
        prompts = generated.prompts[0]
        with divergence_stops_training(step, args.output_dir):  # before anything is shaped or applied
            refuse_infinite_rewards(
                scores.rewards_per_func,
                prompts,
                scores.completions,
                self.reward_func_names,
                self.evaluators,
            )
        completion_rewards = weighted_rewards(scores.rewards_per_func, self.reward_weights)  # (members, completions)
        objective = objective_rewards(
            completion_rewards,
            args.num_generations,
            args.fitness_pass_at_k,
            args.success_reward_threshold,
            args.normalize_fitness_per_prompt,
        )
        if not any_scored(objective):  # e.g. a reward function for another domain of a mixed dataset
            self._skip_unscored_step(scores, completion_rewards, generated, timer)
            return None
        fitness = member_fitness(objective)
        with divergence_stops_training(step, args.output_dir):
            check_fitness(fitness, self.reward_weights.tolist())
            if self._kl_probe is not None:
                fitness = kl_probe.anchored(self, fitness, members)
        shaped = shape_fitness(fitness, args.fitness_shaping)
        self._count_direction(fitness, shaped)

        with timer("update"), divergence_stops_training(step, args.output_dir):  # the master refuses a non-finite step
            update_norm = population.apply_update(
                update_coefficients(members, shaped),
                lr=self.lr_scheduler.get_last_lr()[0],
                weight_decay=args.weight_decay,
            )
        js_diversity = self._noise_scale.js_diversity(completion_rewards)
        self._noise_scale.observe(js_diversity)
        if self._consistency_check_due():
            with timer("check"):
                check_ranks_agree(self.accelerator, population.master, step=step + 1)
                population.backend.check_consistency(step=step + 1)

        self._log_step(scores, completion_rewards, fitness, update_norm, timer, generated, js_diversity)
        step_logging.log_best_member(
            completion_table(self), self.accelerator, self.evaluators, self.reward_func_names, prompts, scores, shaped
        )
        return fitness

    def _count_direction(self, fitness: torch.Tensor, shaped: torch.Tensor) -> None:
        """Count a step without an update direction, and warn after `warn_after_degenerate_steps` of them in a row
        (and every as many after)."""
        counters = self._counters
        if counters.count_direction(shaped) and self.accelerator.is_main_process:
            if counters.degenerate_streak % self.warn_after_degenerate_steps == 0:
                logger.warning(degenerate_steps_warning(counters, fitness, self.state.global_step))

    def _skip_unscored_step(self, scores, completion_rewards, generated, timer) -> None:
        """A step whose completions no reward function scored has no fitness: make no update, warn, count it."""
        self._counters.skipped += 1
        if self.accelerator.is_main_process:  # every process skips the same step
            step = self.state.global_step
            if scores.truncated is not None and bool(scores.truncated.all()):
                warning = truncated_step_warning(self._counters, step, self.args.max_completion_length)
            else:
                warning = unscored_step_warning(self._counters, self._unscored, self.reward_func_names, step)
            logger.warning(warning)
        self._log_step(scores, completion_rewards, None, 0.0, timer, generated)

    def _consistency_check_due(self) -> bool:
        step = self.state.global_step + 1  # the step this update completes
        every = self.args.consistency_check_steps
        return every > 0 and (step % every == 0 or step == self.state.max_steps)

    # ------------------------------------------------------------------------------------------------------------
    # Logging

    def _log_step(self, scores, completion_rewards, fitness, update_norm, timer, generated, js_diversity=None) -> None:
        metrics = logged_metrics(self, "train")
        step_logging.log_step(
            metrics,
            self.reward_func_names,
            scores,
            completion_rewards,
            fitness,
            update_norm,
            timer,
            self._counters,
            js_diversity,
        )
        step_logging.log_completion_lengths(
            self.accelerator, self.state, metrics, self.tokens.end_ids, generated, training=True
        )
        if self.agents.uses_tools:
            step_logging.log_tool_calls(self.accelerator, metrics, generated)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        metrics = logged_metrics(self, "train")
        if self.model.training and self._population is not None and self._reference is not None and metrics:
            metrics["es/param_distance"].append(self._population.master.relative_distance(self._reference))
        logs.pop("grad_norm", None)  # ES has no gradient
        # What ES minimises, -mean fitness: over this entry's steps (`loss`) and over the run (`train_loss`, in the
        # Trainer's last entry).
        if "loss" in logs:
            logs["loss"] = self._losses.take_entry_loss()
        if "train_loss" in logs:
            logs["train_loss"] = self._losses.run_loss()
        super().log(logs, start_time)

    # ------------------------------------------------------------------------------------------------------------
    # Evaluation: the centre model (see `evaluation.py`)

    @torch.no_grad()
    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """Generate the centre's completions of one eval batch with the training backend and settings, and log GRPO's
        eval metrics (`eval_reward`, `eval_rewards/*`, `eval_completions/*`); `evaluation_loop` turns the batches'
        rewards into `eval_loss`."""
        evaluation.evaluate_center_batch(self, inputs)
        return None, None, None

    def coverage_sampler(self) -> Sampler:
        """The sampler coverage evaluation measures this trainer's centre with: its vLLM backend when it has one
        (which holds the centre between steps), `model.generate` otherwise."""
        return evaluation.center_sampler(self)

    def evaluation_loop(
        self, dataloader, description, prediction_loss_only=None, ignore_keys=None, metric_key_prefix="eval"
    ):
        earlier = len(logged_metrics(self, "eval").get("reward", []))
        output = super().evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix)
        loss = evaluation.eval_loss(logged_metrics(self, "eval").get("reward", [])[earlier:])
        if loss is not None:
            output.metrics[f"{metric_key_prefix}_loss"] = loss
        if self.args.eval_ks:
            output.metrics.update(evaluation.coverage_metrics(self, dataloader.dataset, metric_key_prefix))
        return output

    # ------------------------------------------------------------------------------------------------------------
    # Training and checkpoints (the checkpoint hooks: `checkpoint_hooks.py`; the ES state: `resume.py`)

    def train(self, resume_from_checkpoint: str | bool | None = None, **kwargs):
        """As [`~transformers.Trainer.train`], resuming only from a checkpoint whose files all parse:
        `resume_from_checkpoint=True` picks the last such checkpoint, skipping (with a warning) any that a crash or a
        full disk left half-written, and a named checkpoint that is not complete is refused with the reason.

        While it trains it holds `output_dir`'s lock (`output_lock.py`), and SIGTERM or SIGUSR1 ends it after the
        current step with a checkpoint, raising `TrainingPreempted` (`preemption.py`)."""
        check_again_at_train(self.args)
        restore_model_weights(self)  # where an earlier population released them: the Trainer may load into them
        # One run per output_dir, and a scheduler's SIGTERM or SIGUSR1 ends it after the step with a checkpoint.
        with stop_on_preemption(self), hold_output_dir(self.args.output_dir, self.accelerator):
            resume_from_checkpoint = resume.resume_checkpoint(resume_from_checkpoint, self.args.output_dir)
            # A fresh run starts from the model's current weights; a resumed one reloads the master from the
            # checkpoint.
            self._population = self._reference = self._resumed = self._kl_probe = None
            self._micro_step = 0
            self._counters = StepCounters()
            self._noise_scale = NoiseScale(self.args)
            self._losses = step_logging.LossLog()
            output = super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)
        best = self.state.best_model_checkpoint
        if self.args.load_best_model_at_end and best is not None and Path(best).is_dir():
            # The best checkpoint's weights were loaded where the model is kept (`load_best_model_weights`): the
            # population follows it, with that checkpoint's float32 master, as a resume from it would.
            self._population = None
            self._resumed = resume.ResumedRun.load(
                best,
                self._evolving_parameters(),
                self.args,
                self.reward_func_names,
                model_loaded=loads_checkpoint_weights(self, best),
            )
        # `log` set the metrics' `train_loss` (the same dict) from the ES losses; the returned value follows it.
        return output._replace(training_loss=output.metrics.get("train_loss"))

    # ------------------------------------------------------------------------------------------------------------
    # The Hub (see `hub.py`)

    def create_model_card(self, model_name=None, dataset_name=None, tags=None):
        """Write `README.md` in `output_dir`: TRL's model card with the ES hyperparameters and papers."""
        hub.write_model_card(self, model_name, dataset_name, tags)

    def init_hf_repo(self, token: str | None = None) -> None:
        """As [`~transformers.Trainer.init_hf_repo`], and the `hub_revision` branch is created (from `main`) when the
        repository lacks it: the Hub refuses commits to a missing branch, and the checkpoint pushes would fail
        unseen in the background."""
        super().init_hf_repo(token)
        if self.is_world_process_zero():
            hub.create_revision_branch(self.hub_model_id, self.args.hub_revision, token or self.args.hub_token)
