"""ESTrainer: GRPOTrainer's interface, trained with Evolution Strategies instead of a policy gradient.

One ES step (`_es_step`) reads like the method: the step's members, their completions from the backend, the rewards,
the fitness and its shaping, the update of the centre. Where things live: the ES math in `trl_es/core/`, the ways of
generating with members in `trl_es/backends/` (chosen once, by `build_population`), prompt and completion handling in
`rollouts.py`, and every use of TRL's private API in `trl_es/trl_compat.py`.
"""

from __future__ import annotations

import importlib
import logging
import math
import os
import textwrap
import time
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from trl import GRPOConfig, GRPOTrainer
from trl.trainer.utils import nanstd

from ..backends.base import PhaseTimer
from ..backends.hf import TokenIds
from ..backends.population import (
    Population,
    build_population,
    check_backend_config,
    engine_setup,
    evolving_parameters,
)
from ..backends.sampling import SamplingSettings
from ..core.checkpoint import (
    ES_STATE_DIR,
    MASTER_FILE,
    REFERENCE_FILE,
    check_saved_tensors,
    checkpoint_problem,
    checkpoints,
    float32_model_weights,
    last_complete_checkpoint,
    load_es_state,
    save_es_state,
)
from ..core.distributed import (
    check_population_divides,
    check_ranks_agree,
    from_process,
    members_of_this_process,
    whole_batch,
)
from ..core.fitness import any_scored, member_fitness, shape_fitness, update_coefficients, weighted_rewards
from ..core.guards import NonFiniteError, check_finite_tensors, check_fitness, first_infinite_reward
from ..core.noise import population as population_members
from ..core.noise import sampling_seed
from ..core.update_shards import UpdateShards
from ..evaluation.coverage import BackendSampler, Sampler, TransformersSampler
from ..evaluation.metrics import StartingWeights, population_diversity
from ..evaluation.trainer_coverage import measure_trainer
from ..trl_compat import calculate_rewards, completion_table, logged_metrics, take_reward_logs, tracker_urls
from .es_config import ESConfig, changed_run_settings, grpo_loss_defaults, grpo_loss_settings, run_settings
from .model_card import es_hyperparameters, es_papers, generate_es_model_card
from .reward_checks import checked_reward_function, short_repr, unscored_summary
from .rollouts import (
    check_prompt_column,
    check_prompts_fill_a_step,
    completion_metrics,
    decode_completions,
    tokenize_prompts,
    tokenizer_of,
)
from .sampler import EpochSeededRepeatSampler

logger = logging.getLogger(__name__)


class ESTrainer(GRPOTrainer):
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
    3. a member's fitness is the mean of its completions' weighted rewards; the fitness is shaped (`fitness_shaping`);
    4. `theta <- theta + learning_rate * (1/N) * sum_i z_i * eps_i`, accumulated and applied to a float32 master copy.

    Only parameters with `requires_grad=True` evolve (with `peft_config`, the adapter). No gradients, optimizer state
    or activations for backpropagation are kept, and no reference model is built (ES has no KL penalty).

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
        tools, environment_factory, rollout_func:
            Accepted for signature compatibility with [`~trl.GRPOTrainer`] and refused if given: ES generates every
            member with its own weights through its backend, which tool calling and a custom `rollout_func` would
            bypass.
    """

    _tag_names = ["trl", "trl-es", "es"]
    # Warn after this many steps in a row without an update direction (all members equally fit).
    warn_after_degenerate_steps = 10
    _name = "ES"
    _paper = {
        "title": "Evolution Strategies at Scale: LLM Fine-Tuning Beyond Reinforcement Learning",
        "id": "2509.24372",
        "citation": textwrap.dedent("""\
            @article{qiu2025evolution,
                title        = {{Evolution Strategies at Scale: LLM Fine-Tuning Beyond Reinforcement Learning}},
                author       = {Xin Qiu and others},
                year         = 2025,
                eprint       = {arXiv:2509.24372},
            }"""),
    }

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
    ):
        args = _as_es_config(args, model)
        if tools or environment_factory is not None:
            raise NotImplementedError(
                "ESTrainer does not support tool calling (`tools`, `environment_factory`) yet. Remove them, or train "
                "this stage with GRPOTrainer."
            )
        if rollout_func is not None:
            raise NotImplementedError(
                "ESTrainer does not take a `rollout_func`: it generates every population member with that member's "
                "own weights through its backend, and a custom rollout would generate with other weights (GRPO's "
                "policy), so every member would be scored on the same completions. Score multi-step or custom "
                "behaviour in a reward function, or train this stage with GRPOTrainer."
            )
        check_backend_config(args, model, peft_config)
        if args.deepspeed_plugin is not None:
            raise NotImplementedError(
                "ESTrainer does not run under DeepSpeed: ES keeps no gradients or optimizer state for ZeRO to shard, "
                "and ZeRO-3 would shard the weights that every member perturbs. Launch ES stages without DeepSpeed, "
                "e.g. with examples/accelerate_configs/multi_gpu.yaml."
            )
        extract_answer = _import_function(args.eval_answer_extractor, "eval_answer_extractor")  # fail before training
        if train_dataset is not None and hasattr(train_dataset, "__len__") and len(train_dataset) == 0:
            raise ValueError("train_dataset is empty: ES needs at least one prompt per step. Check the dataset split.")
        check_prompt_column(train_dataset, "train_dataset")
        check_prompt_column(eval_dataset, "eval_dataset")
        check_prompts_fill_a_step(train_dataset, args)
        # GRPO's loss settings (beta: a reference model) are hidden from GRPO's constructor and kept in `args`.
        with engine_setup(args), grpo_loss_defaults(args):
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
            )
        self.use_vllm = args.use_vllm
        # GRPO reuses one generation batch for `num_iterations` updates; ES makes one update per prompt batch. Nor is
        # there a policy gradient to correct for vLLM's sampling.
        self.num_iterations = 1
        self.vllm_importance_sampling_correction = False
        check_population_divides(args.population_size, self.accelerator.num_processes)
        self.sampling = SamplingSettings.from_config(args)
        self._tokens = TokenIds.of(self.model, tokenizer_of(self.processing_class))
        self._population: Population | None = None
        # The run's starting weights, on disk (not in memory) in the process that logs and saves: es/param_distance
        self._reference: StartingWeights | None = None
        self._resume_state: tuple[str, dict[str, torch.Tensor]] | None = None  # (checkpoint, lossy float32 masters)
        self._micro_step = 0
        self._extract_answer = extract_answer
        self._losses: list[float] = []  # -mean fitness of each ES step of this `train` call that had a fitness
        self._losses_logged = 0  # how many of them earlier log entries covered
        self._skipped_steps = 0  # steps no reward function scored (no update), over the whole run
        self._degenerate_steps = 0  # steps whose members all had the same fitness (no update), over the whole run
        self._degenerate_streak = 0  # such steps in a row, up to the current one
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
            checkpoint, lossy_masters = self._resume_state or (None, None)
            model = self.accelerator.unwrap_model(self.model)
            origin = f" (from {checkpoint})" if checkpoint else ""
            check_finite_tensors(evolving_parameters(model), f"The model's evolving weights{origin}")
            self._population = build_population(
                self.args,
                model,
                self._tokens,
                llm=getattr(getattr(self, "vllm_generation", None), "llm", None),
                lossy_masters=lossy_masters,
                resumed_from=checkpoint,
                update_shards=self._update_shards(),
            )
            if self._reference is None and self.args.should_save:
                self._reference = StartingWeights.write(self._population.parameters)
        return self._population

    def _update_shards(self) -> UpdateShards | None:
        """How the processes share computing the update, or None to compute all of it on each."""
        processes = self.accelerator.num_processes
        if processes == 1 or not self.args.shard_update:
            return None
        return UpdateShards(self.accelerator.process_index, processes)

    def release_population(self) -> None:
        """Drop the population (and the engine model its backend holds); the next use builds it again."""
        self._population = None

    def _get_train_sampler(self, dataset=None):
        return EpochSeededRepeatSampler.like(super()._get_train_sampler(dataset))

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
                self._losses.append(-fitness.mean().item())
                loss = -fitness.mean().to(loss)
        self._micro_step += 1
        return loss

    @torch.no_grad()
    def _es_step(self, inputs: list[dict[str, Any]]) -> torch.Tensor | None:
        """One ES step on the step's whole prompt batch: members -> completions -> rewards -> fitness -> update.
        Returns the members' fitness, or None for a step that no reward function scored (no update)."""
        args, step, timer = self.args, self.state.global_step, PhaseTimer()
        population = self.population
        noise_seed = args.seed if args.noise_seed is None else args.noise_seed
        members = population_members(noise_seed, step, args.population_size, args.antithetic)
        local_members = members_of_this_process(self.accelerator, members)
        prompts = [example["prompt"] for example in inputs]
        prompt_ids = tokenize_prompts(self.processing_class, prompts, self.chat_template, self.chat_template_kwargs)

        # Every member answers the same prompts; with sampling, row j of every member uses the same seed.
        completion_ids = population.backend.generate(
            local_members, prompt_ids, self.sampling, sampling_seed(noise_seed, step), timer
        )
        with timer("reward"):
            rewards_per_func, completions, extra_columns = self._score(inputs, prompts, prompt_ids, completion_ids)
        with self._divergence_stops_training():  # before anything is shaped or applied
            self._refuse_infinite_rewards(rewards_per_func, prompts, completions)
        completion_rewards = weighted_rewards(rewards_per_func, self.reward_weights)  # (members, completions)
        if not any_scored(completion_rewards):  # e.g. a reward function for another domain of a mixed dataset
            self._skip_unscored_step(rewards_per_func, completion_rewards, prompt_ids, completion_ids, timer)
            return None
        fitness = member_fitness(completion_rewards)
        with self._divergence_stops_training():
            check_fitness(fitness, self.reward_weights.tolist())
        shaped = shape_fitness(fitness, args.fitness_shaping)
        self._count_degenerate_step(fitness, shaped)

        with timer("update"), self._divergence_stops_training():  # the master refuses a non-finite step
            coefficients = update_coefficients(members, shaped)
            update_norm = population.apply_update(
                coefficients, lr=self._get_learning_rate(), weight_decay=args.weight_decay
            )
        if self._consistency_check_due():
            check_ranks_agree(self.accelerator, population.master, step=step + 1)
            population.backend.check_consistency(step=step + 1)

        self._log_step(rewards_per_func, completion_rewards, fitness, update_norm, timer)
        self._log_completion_lengths(prompt_ids, completion_ids, "train")
        self._log_best_member(prompts, completions, extra_columns, rewards_per_func, shaped)
        return fitness

    @contextmanager
    def _divergence_stops_training(self) -> Iterator[None]:
        """Turn a `NonFiniteError` (its message: the cause) into the error that stops training, naming the step and
        the last good checkpoint. Every process raises it: they all hold the same rewards, fitness and update."""
        try:
            yield
        except NonFiniteError as error:
            last = last_complete_checkpoint(self.args.output_dir) if Path(self.args.output_dir).is_dir() else None
            resume = (
                f"the last good checkpoint is {last}: resume from it (resume_from_checkpoint=True) once the cause is "
                "fixed."
                if last
                else "no checkpoint was saved before it, so the run must start again once the cause is fixed."
            )
            raise NonFiniteError(
                f"ES step {self.state.global_step + 1} stopped training: {error} No NaN or infinity was written to "
                f"the weights or a checkpoint; {resume}"
            ) from None

    def _refuse_infinite_rewards(self, rewards_per_func, prompts, completions) -> None:
        """An infinite reward is an error naming the function and the completion: it is no meaningful score, and it
        would make the fitness spread (and with it the update) NaN. NaN stays "no score", as TRL reads it."""
        found = first_infinite_reward(rewards_per_func)  # (member, completion, reward function)
        if found is None:
            return
        member, row, index = found
        local_round, owner = divmod(member, self.accelerator.num_processes)
        completion = (
            f", completion {short_repr(completions[local_round][row])}"
            if owner == self.accelerator.process_index
            else ""
        )
        raise NonFiniteError(
            f"the reward function {self.reward_func_names[index]!r} returned {rewards_per_func[found].item()} for "
            f"member {member}'s answer to prompt {row} ({short_repr(prompts[row])}{completion}). A reward must be a "
            "finite number, or None for no score; clip it in the reward function."
        )

    def _count_degenerate_step(self, fitness, shaped) -> None:
        """A step whose shaped fitness is all zero has no update direction: count it in `es/degenerate_steps`, and
        warn after `warn_after_degenerate_steps` such steps in a row (and every as many after)."""
        if bool(shaped.any()):
            self._degenerate_streak = 0
            return
        self._degenerate_steps += 1
        self._degenerate_streak += 1
        if self._degenerate_streak % self.warn_after_degenerate_steps or not self.accelerator.is_main_process:
            return
        same = bool((fitness == fitness[0]).all())
        why = f"all members scored {fitness[0].item():.4g}" if same else "the fitness spread overflowed float32"
        logger.warning(
            f"The last {self._degenerate_streak} ES steps (up to step {self.state.global_step + 1}) had no update "
            f"direction: {why} ({self._degenerate_steps} such steps so far, logged as es/degenerate_steps). The "
            "reward functions do not tell the members apart: raise sigma, sample (temperature > 0) so that members "
            "answer differently, or use a reward that scores partial progress."
        )

    def _skip_unscored_step(self, rewards_per_func, completion_rewards, prompt_ids, completion_ids, timer) -> None:
        """A step whose completions no reward function scored has no fitness: make no update (as GRPO, which gives
        unscorable completions a zero advantage), warn, and count it in `es/skipped_steps`."""
        self._skipped_steps += 1
        if self.accelerator.is_main_process:  # every process skips the same step
            logger.warning(
                f"Step {self.state.global_step + 1}: no completion of any member was scored "
                f"({unscored_summary(self._unscored, self.reward_func_names)}), so ES has no fitness to compare and "
                f"makes no update ({self._skipped_steps} such steps "
                "so far, logged as es/skipped_steps). Make at least one reward function score these prompts."
            )
        self._log_step(rewards_per_func, completion_rewards, None, 0.0, timer)
        self._log_completion_lengths(prompt_ids, completion_ids, "train")

    def _score(self, inputs, prompts, prompt_ids, completion_ids):
        """Decode and score this process's members' completions, one reward call per member (the batch GRPO would
        score), each gathering that round's rewards from every process.

        Returns the whole population's rewards in member order `(members, completions, reward functions)` (round `j`
        of process `r` is member `j * P + r`), and this process's decoded completions and `log_extra` columns, per
        member."""
        rounds, completions, columns, logged = [], [], [], defaultdict(list)
        self._unscored.clear()  # None and NaN rewards of this step, counted by the checked reward functions
        for member_ids in completion_ids:
            member_completions = decode_completions(self.processing_class, prompts, prompt_ids, member_ids)
            rewards = calculate_rewards(self, inputs, prompts, member_completions, member_ids)  # (P x rows, funcs)
            rounds.append(rewards.view(self.accelerator.num_processes, len(prompts), -1))
            metrics, extra_columns = take_reward_logs(self)
            for name, values in metrics.items():
                logged[name] += values
            completions.append(member_completions)
            columns.append(extra_columns)
        for name, values in logged.items():  # from reward functions' `log_metric`, averaged over the step
            logged_metrics(self, "train")[name].append(sum(values) / len(values))
        return torch.cat(rounds), completions, columns

    def _consistency_check_due(self) -> bool:
        step = self.state.global_step + 1  # the step this update completes
        every = self.args.consistency_check_steps
        return every > 0 and (step % every == 0 or step == self.state.max_steps)

    # ------------------------------------------------------------------------------------------------------------
    # Logging

    def _log_step(self, rewards_per_func, completion_rewards, fitness, update_norm, timer) -> None:
        """The step's metrics; `fitness` is None for a step without one (its reward metrics are then NaN, which GRPO's
        `log` leaves out of its averages)."""
        metrics = logged_metrics(self, "train")
        for index, name in enumerate(self.reward_func_names):
            metrics[f"rewards/{name}/mean"].append(torch.nanmean(rewards_per_func[..., index]).item())
            metrics[f"rewards/{name}/std"].append(nanstd(rewards_per_func[..., index].flatten()).item())
        metrics["reward"].append(torch.nanmean(completion_rewards).item())
        metrics["reward_std"].append(nanstd(completion_rewards.flatten()).item())
        metrics["es/update_norm"].append(update_norm)
        metrics["es/skipped_steps"] = [float(self._skipped_steps)]  # cumulative, like num_tokens
        metrics["es/degenerate_steps"] = [float(self._degenerate_steps)]  # cumulative: steps without a direction
        for phase in ("perturb", "generate", "reward", "update"):
            metrics[f"es/time/{phase}"].append(timer.seconds[phase])
        if fitness is None:
            return
        metrics["es/fitness/mean"].append(fitness.mean().item())
        metrics["es/fitness/std"].append(fitness.std(unbiased=False).item())
        metrics["es/fitness/min"].append(fitness.min().item())
        metrics["es/fitness/max"].append(fitness.max().item())
        if self.args.num_generations > 1:
            metrics["es/js_diversity"].append(
                population_diversity(completion_rewards, self.args.num_generations, self.args.success_reward_threshold)
            )

    def _log_completion_lengths(self, prompt_ids, completion_ids, mode: str) -> None:
        """GRPO's `num_tokens` and `completions/*` over the completions of every member (`completion_ids`: this
        process's, per member) of every process."""
        device = self.accelerator.device
        ends = {*self._tokens.eos, self._tokens.pad}
        rows = [ids for member in completion_ids for ids in member]
        lengths = self.accelerator.gather(torch.tensor([len(ids) for ids in rows], device=device))
        truncated = self.accelerator.gather(
            torch.tensor([not ids or ids[-1] not in ends for ids in rows], device=device)
        )
        metrics = logged_metrics(self, mode)
        if mode == "train":  # as GRPO: tokens seen in training only
            prompt_tokens = sum(len(ids) for ids in prompt_ids) * len(completion_ids) * self.accelerator.num_processes
            self.state.num_input_tokens_seen += prompt_tokens + int(lengths.sum())
        metrics["num_tokens"] = [self.state.num_input_tokens_seen]
        for name, value in completion_metrics(lengths.cpu(), truncated.cpu()).items():
            metrics[name].append(value)

    def _log_best_member(self, prompts, completions, extra_columns, rewards_per_func, shaped) -> None:
        """Fill GRPO's completion table (`log_completions`) with the step's best member (every process holds the same
        values); its "advantage" column holds that member's shaped fitness."""
        best = int(torch.argmax(shaped))
        local, owner = divmod(best, self.accelerator.num_processes)
        own = (completions[local], extra_columns[local])
        best_completions, best_columns = from_process(self.accelerator, own, owner)
        table = completion_table(self)
        table["prompt"].extend(prompts)
        table["completion"].extend(best_completions)
        for index, name in enumerate(self.reward_func_names):
            table["rewards"][name].extend(rewards_per_func[best, :, index].tolist())
        table["advantages"].extend([shaped[best].item()] * len(prompts))
        for column in sorted(best_columns):
            table["extra"][column].extend(best_columns[column])

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        metrics = logged_metrics(self, "train")
        if self.model.training and self._population is not None and self._reference is not None and metrics:
            metrics["es/param_distance"].append(self._population.master.relative_distance(self._reference))
        logs.pop("grad_norm", None)  # ES has no gradient
        # What ES minimises, -mean fitness: over this entry's steps (`loss`) and over the run (`train_loss`, in the
        # Trainer's last entry). Steps without a fitness are left out, as GRPO's `log` leaves out NaN metrics.
        if "loss" in logs:
            logs["loss"] = _mean(self._losses[self._losses_logged :])
            self._losses_logged = len(self._losses)
        if "train_loss" in logs:
            logs["train_loss"] = _mean(self._losses)
        super().log(logs, start_time)

    # ------------------------------------------------------------------------------------------------------------
    # Evaluation: the centre model, scored like GRPO scores it (eval_reward, eval_rewards/*) and, with `eval_ks`, its
    # coverage (eval_pass@k, eval_maj@k, eval_greedy_accuracy, eval_entropy)

    @torch.no_grad()
    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """Generate the centre's completions of one eval batch with the training backend and settings, and log GRPO's
        eval metrics (`eval_reward`, `eval_rewards/*`, `eval_completions/*`); `evaluation_loop` turns the batches'
        rewards into `eval_loss`."""
        prompts = [example["prompt"] for example in inputs]
        prompt_ids = tokenize_prompts(self.processing_class, prompts, self.chat_template, self.chat_template_kwargs)
        seed = sampling_seed(self.args.seed, f"eval-{self.state.global_step}")
        completion_ids = self.population.backend.generate_center(prompt_ids, self.sampling, seed)
        completions = decode_completions(self.processing_class, prompts, prompt_ids, completion_ids)
        rewards_per_func = calculate_rewards(self, inputs, prompts, completions, completion_ids)
        take_reward_logs(self)
        rewards = weighted_rewards(rewards_per_func, self.reward_weights)
        metrics = logged_metrics(self, "eval")
        for index, name in enumerate(self.reward_func_names):
            metrics[f"rewards/{name}/mean"].append(torch.nanmean(rewards_per_func[:, index]).item())
            metrics[f"rewards/{name}/std"].append(nanstd(rewards_per_func[:, index]).item())
        metrics["reward"].append(torch.nanmean(rewards).item())
        metrics["reward_std"].append(nanstd(rewards).item())
        self._log_completion_lengths(prompt_ids, [completion_ids], "eval")
        return None, None, None

    def coverage_sampler(self) -> Sampler:
        """The sampler coverage evaluation measures this trainer's centre with: its vLLM backend when it has one
        (which holds the centre between steps), `model.generate` otherwise."""
        model = self.accelerator.unwrap_model(self.model)
        if not self.use_vllm:
            return TransformersSampler(model, self.processing_class)
        return BackendSampler(self.population.backend, self.sampling)

    def evaluation_loop(
        self, dataloader, description, prediction_loss_only=None, ignore_keys=None, metric_key_prefix="eval"
    ):
        earlier = len(logged_metrics(self, "eval").get("reward", []))
        output = super().evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix)
        # `eval_loss` = -`eval_reward` (averaged as GRPO's `log` averages it, NaN batches left out), the training
        # loss's meaning, so that `load_best_model_at_end` and early stopping work with their default metric. Absent
        # when no eval completion was scored.
        rewards = logged_metrics(self, "eval").get("reward", [])[earlier:]
        loss = _mean([-reward for reward in rewards if not math.isnan(reward)])
        if loss is not None:
            output.metrics[f"{metric_key_prefix}_loss"] = loss
        args = self.args
        if args.eval_ks:
            dataset = dataloader.dataset
            if not hasattr(dataset, "__len__"):
                raise NotImplementedError(
                    "eval_ks measures coverage on a map-style eval_dataset (one with a length); this one is iterable. "
                    "Pass a `datasets.Dataset`, or unset eval_ks."
                )
            report = measure_trainer(
                self,
                dataset,
                args.eval_ks,
                self._extract_answer,
                success_threshold=args.success_reward_threshold,
                temperature=args.eval_temperature,
                seed=args.seed,
            )
            output.metrics.update({f"{metric_key_prefix}_{name}": value for name, value in report.as_dict().items()})
        return output

    # ------------------------------------------------------------------------------------------------------------
    # Checkpoints

    def train(self, resume_from_checkpoint: str | bool | None = None, **kwargs):
        """As [`~transformers.Trainer.train`], resuming only from a checkpoint whose files all parse:
        `resume_from_checkpoint=True` picks the last such checkpoint, skipping (with a warning) any that a crash or a
        full disk left half-written, and a named checkpoint that is not complete is refused with the reason."""
        if resume_from_checkpoint is True:
            resume_from_checkpoint = self._last_complete_checkpoint()
        elif isinstance(resume_from_checkpoint, (str, os.PathLike)):
            problem = checkpoint_problem(resume_from_checkpoint)
            if problem is not None:
                raise ValueError(
                    f"Cannot resume from {resume_from_checkpoint}: {problem}. Resume from an earlier checkpoint, or "
                    "pass `resume_from_checkpoint=True` to pick the last complete one."
                )
        # A fresh run starts from the model's current weights; a resumed one reloads the master from the checkpoint.
        self._population = self._reference = self._resume_state = None
        self._micro_step = self._losses_logged = self._skipped_steps = 0
        self._degenerate_steps = self._degenerate_streak = 0
        self._losses = []
        output = super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)
        best = self.state.best_model_checkpoint
        if self.args.load_best_model_at_end and best is not None and Path(best).is_dir():
            # The Trainer loaded the best checkpoint's weights into the model: the population follows it, with that
            # checkpoint's float32 master, as a resume from it would.
            self._population = None
            self._resume_state = (best, load_es_state(best)[0])
        # `log` set the metrics' `train_loss` (the same dict) from the ES losses; the returned value follows it.
        return output._replace(training_loss=output.metrics.get("train_loss"))

    def _last_complete_checkpoint(self) -> str:
        """The checkpoint `resume_from_checkpoint=True` resumes from, or an error that says why none can be."""
        found = last_complete_checkpoint(self.args.output_dir)  # warns about each newer one it skips
        if found is not None:
            return found
        reasons = [f"{path.name}: {problem}" for path, problem in checkpoints(self.args.output_dir)]
        raise ValueError(
            f"No complete checkpoint found in output_dir={self.args.output_dir!r}"
            + (f" ({'; '.join(reasons)})." if reasons else " (it holds no checkpoint-<step> directory).")
            + " Train without `resume_from_checkpoint`, or point it at a checkpoint directory."
        )

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """As [`~transformers.Trainer.save_model`] (also how every checkpoint writes its weights), but weights holding
        NaN or infinity are refused with a `NonFiniteError` before anything is written."""
        model = self.accelerator.unwrap_model(self.model)
        check_finite_tensors(
            dict(model.named_parameters()), f"The weights to be saved to {output_dir or self.args.output_dir}"
        )
        super().save_model(output_dir, _internal_call)

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        # Written before `trainer_state.json`, which the Trainer writes last: a checkpoint with a Trainer state always
        # has its ES state.
        super()._save_optimizer_and_scheduler(output_dir)
        if self.args.should_save and self._population is not None:
            save_es_state(
                output_dir,
                master=self._population.master.state_dict(),
                parameter_dtypes={name: param.dtype for name, param in self._population.parameters.items()},
                reference=self._reference,
                metadata={
                    "global_step": self.state.global_step,
                    "skipped_steps": self._skipped_steps,
                    "degenerate_steps": self._degenerate_steps,
                    "reward_funcs": self.reward_func_names,
                    **run_settings(self.args),
                },
            )

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        lossy_masters, reference, metadata = load_es_state(checkpoint)
        self._warn_about_changed_settings(checkpoint, metadata)
        parameters = evolving_parameters(self.accelerator.unwrap_model(self.model))
        state_dir = Path(checkpoint) / ES_STATE_DIR
        check_saved_tensors(state_dir / MASTER_FILE, lossy_masters, parameters)
        check_saved_tensors(state_dir / REFERENCE_FILE, reference, parameters, complete=True)
        # The model already holds the checkpoint's weights: they are the master wherever they are float32. Where the
        # model now rounds them (a float32 run resumed in bf16), the master comes from the checkpoint's float32 files.
        lossy_masters.update(self._float32_masters_from_model_files(checkpoint, parameters, lossy_masters))
        self._population = None
        self._resume_state = (checkpoint, lossy_masters)  # a vLLM server rebuilds its master from the same files
        self._reference = StartingWeights.write(reference) if self.args.should_save else None
        self._skipped_steps = metadata.get("skipped_steps", 0)
        self._degenerate_steps = metadata.get("degenerate_steps", 0)

    def _warn_about_changed_settings(self, checkpoint: str, metadata: dict) -> None:
        """Name every run setting (and reward function) that differs from the checkpoint's: the run will not continue
        the original one. A new learning_rate does not even apply: the checkpoint's scheduler is restored."""
        changed = changed_run_settings(metadata, self.args)
        if "reward_funcs" in metadata and metadata["reward_funcs"] != self.reward_func_names:
            changed["reward_funcs"] = (metadata["reward_funcs"], self.reward_func_names)
        for name, (saved, current) in changed.items():
            if name == "learning_rate":
                effect = (
                    f"the checkpoint's learning-rate scheduler is restored (as by any transformers Trainer), so the "
                    f"saved schedule wins and the run continues with learning_rate={saved!r}. To train with "
                    f"learning_rate={current!r}, start a new run from the checkpoint's weights (model={checkpoint!r})."
                )
            else:
                effect = (
                    f"the run will not continue the original one exactly. Resume with {name}={saved!r} to continue it."
                )
            warnings.warn(
                f"Resuming from {checkpoint}, written with {name}={saved!r}, with {name}={current!r}: {effect}",
                UserWarning,
                stacklevel=3,
            )

    @staticmethod
    def _float32_masters_from_model_files(checkpoint, parameters, lossy_masters) -> dict[str, torch.Tensor]:
        """Float32 masters, read from the checkpoint's weight files, of the parameters that the model rounds now but
        that the checkpoint saved in float32 (so its ES state holds no master for them)."""
        names = [n for n, p in parameters.items() if p.dtype != torch.float32 and n not in lossy_masters]
        if not names:
            return {}
        found = float32_model_weights(checkpoint, names)
        check_saved_tensors(f"the weight files of {checkpoint}", found, parameters)
        missing = [name for name in names if name not in found]
        if missing:
            warnings.warn(
                f"{checkpoint} holds no float32 weights of {len(missing)} parameters the model now holds in "
                f"{parameters[missing[0]].dtype} (e.g. {missing[0]!r}): their master starts from the rounded "
                "weights, so the run does not continue the original one exactly. Resume in the dtype the checkpoint "
                "was written in to continue it.",
                UserWarning,
                stacklevel=3,
            )
        return found

    def create_model_card(self, model_name=None, dataset_name=None, tags=None):
        """Write `README.md` in `output_dir`: TRL's model card with the ES hyperparameters and papers."""
        if not self.is_world_process_zero():
            return
        model_id = getattr(self.model.config, "_name_or_path", None)
        base_model = model_id if model_id and not Path(model_id).is_dir() else None
        tags = {tags} if isinstance(tags, str) else set(tags or ())
        card = generate_es_model_card(
            base_model=base_model,
            model_name=model_name or Path(self.args.output_dir).name,
            hub_model_id=self.hub_model_id,
            dataset_name=dataset_name,
            tags=sorted(tags | set(self._tag_names)),
            hyperparameters=es_hyperparameters(self.args),
            reward_functions=self.reward_func_names,
            reward_weights=self.reward_weights.tolist(),
            papers=es_papers(self.args),
            **tracker_urls(),
        )
        card.save(Path(self.args.output_dir) / "README.md")

    def init_hf_repo(self, token: str | None = None) -> None:
        """As [`~transformers.Trainer.init_hf_repo`], and the `hub_revision` branch is created (from `main`) when the
        repository lacks it: the Hub refuses commits to a missing branch, and the checkpoint pushes would fail
        unseen in the background."""
        super().init_hf_repo(token)
        revision = self.args.hub_revision
        if self.is_world_process_zero() and revision is not None and not revision.startswith("refs/pr/"):
            from huggingface_hub import HfApi

            token = token or self.args.hub_token
            HfApi().create_branch(self.hub_model_id, branch=revision, token=token, exist_ok=True)


def _as_es_config(args, model) -> ESConfig:
    if isinstance(args, ESConfig):
        return args
    if args is None:
        model_name = model if isinstance(model, str) else model.config._name_or_path
        return ESConfig(f"{Path(str(model_name)).name}-ES")
    if isinstance(args, GRPOConfig):
        es_args = ESConfig.from_grpo_config(args)
        ignored = grpo_loss_settings(args)
        notes = [
            f"ES defaults apply to population_size={es_args.population_size}, sigma={es_args.sigma} and the ES step "
            f"size learning_rate={es_args.learning_rate} (GRPO's learning_rate={args.learning_rate} is an AdamW step "
            "size); pass an ESConfig to choose them."
        ]
        if ignored:
            notes.append(
                f"GRPO's loss settings are ignored ({', '.join(ignored)}): ES has no policy-gradient loss and no KL "
                "penalty, so no reference model is built."
            )
        if es_args.num_generations > 1:
            notes.append(
                f"Each member samples num_generations={es_args.num_generations} completions per prompt at "
                f"temperature={es_args.temperature}, as GRPO samples its group (ES's own default is one greedy "
                "completion per prompt)."
            )
        warnings.warn(
            f"ESTrainer got a GRPOConfig and converted it to an ESConfig. {' '.join(notes)}",
            UserWarning,
            stacklevel=3,
        )
        return es_args
    raise TypeError(f"args must be an ESConfig or a GRPOConfig, got {type(args).__name__}.")


def _mean(values: list[float]) -> float | None:
    """The mean of `values`, or None (as GRPO logs a metric without values) when there are none."""
    return sum(values) / len(values) if values else None


def _import_function(path: str | None, field_name: str) -> Callable | None:
    """The function at import path `path` (`"package.module.function"`), or None when `path` is None."""
    if path is None:
        return None
    module_name, _, attribute = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError, ValueError) as error:
        raise ValueError(
            f"{field_name}={path!r} is not an importable function ({error}). Give its full import path, e.g. "
            "'trl_es.tasks.arithmetic.extract_answer', with its module on the Python path."
        ) from error
