"""ESTrainer: GRPOTrainer's interface, trained with Evolution Strategies instead of a policy gradient."""

from __future__ import annotations

import copy
import importlib
import tempfile
import textwrap
import time
import warnings
from collections import defaultdict
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import is_peft_model
from trl import GRPOConfig, GRPOTrainer
from trl.trainer.utils import nanstd

from .backends import HFBackend
from .backends.sampling import SamplingSettings
from .backends.vllm_colocate import VLLMColocateBackend
from .backends.vllm_lora import VLLMLoRAPopulationBackend, lora_enabled_llm, lora_target_parameters
from .backends.vllm_server import VLLMServerBackend
from .checkpoint import last_complete_checkpoint, load_es_state, save_es_state
from .distributed import (
    check_population_divides,
    check_ranks_agree,
    from_process,
    members_of_this_process,
    whole_batch,
)
from .es_config import ESConfig
from .evaluation import left_padded, until_eos
from .fitness import shape_fitness, update_coefficients
from .lowrank import LowRankMasterWeights, common_random_sampling, lowrank_population
from .master import MasterWeights
from .metrics import js_diversity
from .model_card import es_hyperparameters, generate_es_model_card
from .noise import Member, population, sampling_seed
from .sampler import EpochSeededRepeatSampler
from .trainer_evaluation import measure_trainer


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
    or activations for backpropagation are kept.

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
        optimizers, quantization_config, peft_config, rollout_func:
            As in [`~trl.GRPOTrainer`]. The optimizer is never stepped with gradients; its scheduler sets the ES step
            size from `args.learning_rate`.
        args ([`ESConfig`] or [`~trl.GRPOConfig`], *optional*):
            Configuration. A `GRPOConfig` is converted with [`ESConfig.from_grpo_config`] (with a warning), so an
            unmodified GRPO script runs after the class swap.
        tools, environment_factory:
            Accepted for signature compatibility with [`~trl.GRPOTrainer`]; ES does not support tool calling yet and
            raises if they are given.
    """

    _tag_names = ["trl", "trl-es", "es"]
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
        if args.use_vllm:
            _check_vllm_setup(args, model, peft_config)
        if args.deepspeed_plugin is not None:
            raise NotImplementedError(
                "ESTrainer does not run under DeepSpeed: ES keeps no gradients or optimizer state for ZeRO to shard, "
                "and ZeRO-3 would shard the weights that every member perturbs. Launch ES stages without DeepSpeed, "
                "e.g. with examples/accelerate_configs/multi_gpu.yaml."
            )
        extract_answer = _import_function(args.eval_answer_extractor, "eval_answer_extractor")  # fail before training
        if train_dataset is not None and hasattr(train_dataset, "__len__") and len(train_dataset) == 0:
            raise ValueError("train_dataset is empty: ES needs at least one prompt per step. Check the dataset split.")
        with _hidden_from_grpo_if_server(args), _lora_engine_if_lowrank(args):
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
                rollout_func=rollout_func,
            )
        self.use_vllm = args.use_vllm
        # GRPO reuses one generation batch for `num_iterations` updates; ES makes one update per prompt batch. Nor is
        # there a policy gradient to correct for vLLM's sampling (evaluation would otherwise ask for its logprobs).
        self.num_iterations = 1
        self.vllm_importance_sampling_correction = False
        check_population_divides(args.population_size, self.accelerator.num_processes)
        if args.temperature == 0:
            self._use_greedy_decoding()
        self._master: MasterWeights | None = None
        self._reference: dict[str, torch.Tensor] | None = None
        self._model_weights: HFBackend | None = None  # writes the master into the trainer's model
        self._backend = None  # where members are generated: the model itself, or a vLLM engine or server
        self._vllm_sampling_seed: int | None = None
        self._population: tuple[list[Member], int] | None = None  # (members, rows each) while a batch generates
        self._resumed_from: str | None = None
        self._extract_answer = extract_answer

    def _use_greedy_decoding(self):
        greedy = {"do_sample": False, "temperature": None, "top_p": None, "top_k": None, "min_p": None}
        if hasattr(self, "generation_kwargs"):
            self.generation_kwargs.update(greedy)
            for key, value in greedy.items():
                setattr(self.generation_config, key, value)

    def _get_train_sampler(self, dataset=None):
        grpo_sampler = super()._get_train_sampler(dataset)
        return EpochSeededRepeatSampler(
            data_source=grpo_sampler.data_source,
            mini_repeat_count=grpo_sampler.mini_repeat_count,
            batch_size=grpo_sampler.batch_size,
            repeat_count=grpo_sampler.repeat_count,
            shuffle=grpo_sampler.shuffle,
            seed=grpo_sampler.seed,
        )

    # ------------------------------------------------------------------------------------------------------------
    # The ES step

    def training_step(self, model, inputs, num_items_in_batch=None) -> torch.Tensor:
        # As in `Trainer.training_step`: GRPO's metrics are filed under "train" only while the model is in train mode.
        model.train()
        # GRPO's sampler repeats each generation batch `gradient_accumulation_steps` times; the ES step runs on the
        # first copy and the repeats are the same prompts.
        if self._step % self.args.gradient_accumulation_steps == 0:
            start = time.perf_counter()
            self._es_step(whole_batch(self.accelerator, inputs))
            self._metrics["train"]["step_time"].append(time.perf_counter() - start)
        self._step += 1
        # ES has no loss; the Trainer loop needs a tensor, and `log` drops the resulting `loss` entry.
        return torch.zeros((), device=self.args.device)

    @torch.no_grad()
    def _es_step(self, inputs: list[dict[str, Any]]) -> None:
        args = self.args
        master, backend = self._population_state()
        members = population(args.seed, self.state.global_step, args.population_size, args.antithetic)
        prompts = [example["prompt"] for example in inputs]
        seconds = defaultdict(float)

        local_members = members_of_this_process(self.accelerator, members)
        if self._batches_population():
            evaluations = self._evaluate_population_batches(inputs, prompts, local_members, seconds)
        else:
            evaluations = []  # this process's members, one per round (see distributed.py)
            try:
                for member in local_members:
                    with _timed(seconds, "perturb"):
                        backend.load_member(member)
                    evaluations.append(self._evaluate_member(inputs, prompts, seconds))
            except BaseException:
                backend.load_center()  # a failed step must not leave a member's weights behind
                raise

        # Each round's rewards were gathered across processes: rows of members jP .. jP + P - 1, in order.
        num_processes = self.accelerator.num_processes
        rewards_per_func = torch.cat(
            [e.rewards_per_func.view(num_processes, len(prompts), -1) for e in evaluations]
        )  # (members, completions, reward functions)
        completion_rewards = self._weighted_rewards(rewards_per_func)
        fitness = _member_fitness(completion_rewards, self.reward_func_names)
        shaped = shape_fitness(fitness, args.fitness_shaping)
        with _timed(seconds, "update"):
            coefficients = update_coefficients(members, shaped)
            lr = self._get_learning_rate()
            update_norm = master.apply_update(coefficients, lr=lr, weight_decay=args.weight_decay)
            backend.after_update(coefficients, lr=lr, weight_decay=args.weight_decay)
            self._load_center()
        if self._consistency_check_due():
            check_ranks_agree(self.accelerator, master, step=self.state.global_step + 1)
            backend.check_consistency(self.model, step=self.state.global_step + 1)
        self._log_step_metrics(rewards_per_func, completion_rewards, fitness, update_norm, seconds)
        if args.num_generations > 1:
            self._metrics["train"]["es/js_diversity"].append(
                _population_diversity(completion_rewards, args.num_generations, args.success_reward_threshold)
            )
        best = int(torch.argmax(fitness))
        round_, owner = divmod(best, num_processes)
        completions, extra_logs = from_process(
            self.accelerator, (evaluations[round_].completions, evaluations[round_].extra_logs), owner
        )
        self._log_completions_of(prompts, completions, extra_logs, rewards_per_func[best], shaped[best].item())

    def _evaluate_member(self, inputs, prompts, seconds) -> _MemberEvaluation:
        """Generate with the weights currently loaded and score the completions."""
        with _timed(seconds, "generate"):
            completions, completion_ids = self._generate_for_member(prompts)
        with _timed(seconds, "reward"):
            rewards_per_func = self._calculate_rewards(inputs, prompts, completions, completion_ids)
        extra_logs = dict(self._pending_extra_logs)  # columns that reward functions logged for this member
        self._pending_extra_logs.clear()
        return _MemberEvaluation(completions, rewards_per_func, extra_logs)

    def _batches_population(self) -> bool:
        """Low-rank members generate together: through forward hooks in `model.generate`, as LoRA adapters in vLLM."""
        return self.args.perturbation == "lowrank"

    def _evaluate_population_batches(self, inputs, prompts, members, seconds) -> list[_MemberEvaluation]:
        """Evaluate this process's low-rank members `population_batch_size` at a time, each batch in one `generate`
        call whose rows are member-major (see lowrank.py); the weights stay the centre's throughout.

        Returns one evaluation per member, in round order, each with the rewards of that round's members of every
        process, as `_evaluate_member` does."""
        num_processes, rows = self.accelerator.num_processes, len(prompts)
        per_call = self.args.population_batch_size or len(members)
        evaluations = []
        for start in range(0, len(members), per_call):
            batch = members[start : start + per_call]
            with _timed(seconds, "generate"), self._generating_population(batch, rows):
                completions, completion_ids = self._generate_for_member(prompts * len(batch))
            with _timed(seconds, "reward"):
                rewards = self._calculate_rewards(
                    inputs * len(batch), prompts * len(batch), completions, completion_ids
                )
            extra_logs = dict(self._pending_extra_logs)
            self._pending_extra_logs.clear()
            by_member = rewards.view(num_processes, len(batch), rows, -1)  # gathered: process, member, row
            for index in range(len(batch)):
                own = slice(index * rows, (index + 1) * rows)
                evaluations.append(
                    _MemberEvaluation(
                        completions[own],
                        by_member[:, index].reshape(num_processes * rows, -1),
                        {column: values[own] for column, values in extra_logs.items()},
                    )
                )
        return evaluations

    @contextmanager
    def _generating_population(self, members: list[Member], rows: int):
        """Within it, generation of `len(members) * rows` member-major rows gives each member's rows its perturbation
        (see `_generate_single_turn`)."""
        hooks = (
            nullcontext()
            if self.use_vllm
            else lowrank_population(self.model, self._master, members, self.args.sigma, rows)
        )
        self._population = (members, rows)
        try:
            with hooks:
                yield
        finally:
            self._population = None

    def _generate_for_member(self, prompts: list) -> tuple[list, list[list[int]]]:
        # Common random numbers: every member of a step samples with the same seed. `model.generate` draws from the
        # global generator; vLLM gets the seed per row (see `_generate_single_turn`).
        seed = sampling_seed(self.args.seed, self.state.global_step)
        if self.use_vllm:
            self._vllm_sampling_seed = seed
            try:
                _, completion_ids, _, completions, _, _, _, _ = self._generate(prompts)
            finally:
                self._vllm_sampling_seed = None
            return completions, completion_ids
        devices = [self.accelerator.device] if self.accelerator.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            _, completion_ids, _, completions, _, _, _, _ = self._generate(prompts)
        return completions, completion_ids

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        if not self.use_vllm:
            if self._population is not None and self.temperature > 0 and images is None:
                return self._generate_population_rows(prompt_ids), None
            return super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations)
        if images is not None:
            raise NotImplementedError("ESTrainer does not generate from images with vLLM yet.")
        # GRPO's vLLM path would push the trainer's weights (the centre) into the engine: the backend owns them.
        _, backend = self._population_state()
        if self._population is not None:  # every member's copy of the rows, one LoRA adapter per member
            members, rows = self._population
            return backend.generate_population(prompt_ids[:rows], members, seed=self._vllm_sampling_seed), None
        return backend.generate(prompt_ids, seed=self._vllm_sampling_seed), None

    @torch.no_grad()
    def _generate_population_rows(self, prompt_ids: list[list[int]]) -> list[list[int]]:
        """`model.generate` over a batched population's rows, sampling with common random numbers: every member's
        j-th row draws the same Gumbel noise (`CommonRandomGumbel`), as members evaluated one at a time draw the same
        random numbers. GRPO's generation path would give every row of the batch its own."""
        model = self.accelerator.unwrap_model(self.model)
        input_ids, attention_mask = left_padded(prompt_ids, self._tokenizer.pad_token_id, model.device)
        seed = sampling_seed(self.args.seed, self.state.global_step)
        processors = common_random_sampling(
            seed, self._population[1], self.temperature, self.top_k, self.top_p, self.min_p
        )
        config = copy.deepcopy(self.generation_config)  # the processors sample; generate takes their argmax
        config.update(do_sample=False, temperature=None, top_p=None, top_k=None, min_p=None)
        was_training = model.training
        model.eval()
        output = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            generation_config=config,
            logits_processor=processors,
        )
        model.train(was_training)
        return [until_eos(row, set(self.eos_token_ids)) for row in output[:, input_ids.shape[1] :].tolist()]

    def _weighted_rewards(self, rewards_per_func: torch.Tensor) -> torch.Tensor:
        """Per-completion reward with TRL's semantics: NaN (`None`) entries are skipped; a completion that no function
        scored stays NaN, so it does not count in its member's fitness."""
        weights = self.reward_weights.to(rewards_per_func.device)
        rewards = (rewards_per_func * weights).nansum(dim=-1)
        rewards[torch.isnan(rewards_per_func).all(dim=-1)] = torch.nan
        return rewards

    def _population_state(self):
        """The master and the generation backend, created from the model's current weights when a run starts."""
        if self._master is None:
            self._start_master()
        if self._backend is None:
            self._backend = self._make_backend()
            self._backend.check_consistency(self.model, step=self.state.global_step)
        return self._master, self._backend

    def _start_master(self, lossy_masters: dict[str, torch.Tensor] | None = None) -> None:
        """Copy the evolving parameters into a new float32 master; a resumed run passes the float32 masters of its
        non-float32 parameters, which the model's weights only hold rounded.

        When members are generated elsewhere (vLLM) or through hooks (low-rank batches), the model only ever holds
        the centre, so its float32 parameters are their own master: no second float32 copy of the model."""
        parameters = self._evolving_parameters()
        args = self.args
        share = self.use_vllm or self._batches_population()
        if args.perturbation == "lowrank" and self.use_vllm:
            # LoRA adapters perturb the decoder's projections; everything else stays fixed (checked at construction).
            targets = set(lora_target_parameters(self.model)) & set(parameters)
            self._master = LowRankMasterWeights(parameters, targets, args.lowrank_rank, "frozen", share_float32=share)
        elif args.perturbation == "lowrank":
            self._master = LowRankMasterWeights.from_model(
                self.model, parameters, args.lowrank_rank, args.lowrank_other_parameters, share_float32=share
            )
        else:
            self._master = MasterWeights(parameters, share_float32=share)
        if lossy_masters:
            self._master.load_state_dict({**self._master.state_dict(), **lossy_masters})
        self._reference = {name: param.detach().to("cpu", copy=True) for name, param in parameters.items()}
        self._model_weights = HFBackend(parameters, self._master, self.args.sigma)

    def _make_backend(self):
        if not self.use_vllm:
            return self._model_weights
        sampling = SamplingSettings.from_trainer(self)
        if self.vllm_mode == "colocate" and self.args.perturbation == "lowrank":
            adapter_dir = tempfile.mkdtemp(prefix="trl-es-lora-")
            backend = VLLMLoRAPopulationBackend(
                self.vllm_generation.llm, self._master, self.args.sigma, sampling, adapter_dir
            )
            backend.load_weights(self.model.named_parameters())
            return backend
        if self.vllm_mode == "colocate":
            backend = VLLMColocateBackend(self.vllm_generation.llm, self._master, self.args.sigma, sampling)
            # The engine loaded the checkpoint from disk; the run starts from the trainer's weights.
            backend.load_weights(self.model.named_parameters())
            return backend
        args = self.args
        base_url = args.vllm_server_base_url or f"http://{args.vllm_server_host}:{args.vllm_server_port}"
        backend = VLLMServerBackend(base_url, self._master, args.sigma, sampling, timeout=args.vllm_server_timeout)
        dtypes = {param.dtype for param in self._model_weights.parameters.values()}
        if len(dtypes) > 1:
            raise NotImplementedError(
                f"vllm_mode='server' needs the evolving parameters in one dtype, got {sorted(map(str, dtypes))}. Load "
                "the model in a single dtype (`model_init_kwargs={'dtype': ...}`, `cast_lm_head_to_fp32=False`)."
            )
        backend.start_run(parameter_dtype=str(dtypes.pop()).removeprefix("torch."), checkpoint=self._resumed_from)
        return backend

    def _load_center(self) -> None:
        """Put the centre (the master) back wherever weights are read: the trainer's model and the backend."""
        self._model_weights.load_center()
        if self._backend is not self._model_weights:
            self._backend.load_center()

    def _consistency_check_due(self) -> bool:
        step = self.state.global_step + 1  # the step this update completes
        every = self.args.consistency_check_steps
        return every > 0 and (step % every == 0 or step == self.state.max_steps)

    def _evolving_parameters(self) -> dict[str, torch.nn.Parameter]:
        parameters = {name: param for name, param in self.model.named_parameters() if param.requires_grad}
        if not parameters:
            raise ValueError(
                "The model has no parameter with requires_grad=True, so ES has nothing to evolve. Unfreeze the "
                "parameters to train, or pass a `peft_config`."
            )
        return parameters

    # ------------------------------------------------------------------------------------------------------------
    # Logging

    def _log_step_metrics(self, rewards_per_func, completion_rewards, fitness, update_norm, seconds) -> None:
        metrics = self._metrics["train"]
        for index, name in enumerate(self.reward_func_names):
            metrics[f"rewards/{name}/mean"].append(torch.nanmean(rewards_per_func[..., index]).item())
            metrics[f"rewards/{name}/std"].append(nanstd(rewards_per_func[..., index].flatten()).item())
        metrics["reward"].append(torch.nanmean(completion_rewards).item())
        metrics["reward_std"].append(nanstd(completion_rewards.flatten()).item())
        metrics["es/fitness/mean"].append(fitness.mean().item())
        metrics["es/fitness/std"].append(fitness.std(unbiased=False).item())
        metrics["es/fitness/min"].append(fitness.min().item())
        metrics["es/fitness/max"].append(fitness.max().item())
        metrics["es/update_norm"].append(update_norm)
        for phase in ("perturb", "generate", "reward", "update"):
            metrics[f"es/time/{phase}"].append(seconds[phase])
        for name, values in self._pending_metrics.items():  # from reward functions' `log_metric`
            metrics[name].append(sum(values) / len(values))
        self._pending_metrics.clear()

    def _log_completions_of(self, prompts, completions, extra_logs, rewards_per_func, shaped_fitness: float) -> None:
        """Fill GRPO's completion table (`log_completions`) with the step's best member (every process holds the same
        values); its "advantage" column holds that member's shaped fitness."""
        self._logs["prompt"].extend(prompts)
        self._logs["completion"].extend(completions)
        for index, name in enumerate(self.reward_func_names):
            self._logs["rewards"][name].extend(rewards_per_func[:, index].tolist())
        self._logs["advantages"].extend([shaped_fitness] * len(prompts))
        for column in sorted(extra_logs):
            self._logs["extra"][column].extend(extra_logs[column])

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if self.model.training and self._master is not None and self._metrics["train"]:
            self._metrics["train"]["es/param_distance"].append(self._master.relative_distance(self._reference))
        # ES has neither a loss nor gradients: drop the Trainer's placeholders instead of logging zeros.
        for key in ("loss", "grad_norm", "train_loss"):
            logs.pop(key, None)
        super().log(logs, start_time)

    # ------------------------------------------------------------------------------------------------------------
    # Evaluation: the centre model, scored like GRPO scores it (eval_reward, eval_rewards/*, completions/*) and, with
    # `eval_ks`, its coverage (eval_pass@k, eval_maj@k, eval_greedy_accuracy, eval_entropy)

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        with torch.no_grad():
            self._generate_and_score_completions(inputs)
        return None, None, None

    def evaluation_loop(
        self, dataloader, description, prediction_loss_only=None, ignore_keys=None, metric_key_prefix="eval"
    ):
        output = super().evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix)
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
        """As [`~transformers.Trainer.train`]; `resume_from_checkpoint=True` picks the last *complete* checkpoint, so
        one that a crash left half-written is skipped."""
        if resume_from_checkpoint is True:
            resume_from_checkpoint = last_complete_checkpoint(self.args.output_dir)
            if resume_from_checkpoint is None:
                raise ValueError(
                    f"No complete checkpoint found in output_dir={self.args.output_dir!r}. Train without "
                    "`resume_from_checkpoint`, or point it at a checkpoint directory."
                )
        # A fresh run starts from the model's current weights; a resumed one reloads the master from the checkpoint.
        self._master = self._reference = self._backend = self._resumed_from = None
        return super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        # Written before `trainer_state.json`, which the Trainer writes last: a checkpoint with a Trainer state always
        # has its ES state.
        super()._save_optimizer_and_scheduler(output_dir)
        if self.args.should_save and self._master is not None:
            parameters = self._evolving_parameters()
            save_es_state(
                output_dir,
                master=self._master.state_dict(),
                parameter_dtypes={name: param.dtype for name, param in parameters.items()},
                reference=self._reference,
                metadata={"global_step": self.state.global_step, **es_hyperparameters(self.args)},
            )

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        lossy_masters, reference, metadata = load_es_state(checkpoint)
        for name in ("population_size", "sigma", "antithetic", "fitness_shaping", "seed"):
            if metadata.get(name) != getattr(self.args, name):
                warnings.warn(
                    f"Resuming from {checkpoint}, written with {name}={metadata.get(name)!r}, with "
                    f"{name}={getattr(self.args, name)!r}: the run will not continue the original one exactly.",
                    UserWarning,
                    stacklevel=2,
                )
        # The model already holds the checkpoint's weights: they are the master wherever they are float32.
        self._start_master(lossy_masters)
        self._reference = reference
        self._resumed_from = checkpoint  # a vLLM server rebuilds its master from the same files

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
        )
        card.save(Path(self.args.output_dir) / "README.md")


def _check_vllm_setup(args: ESConfig, model, peft_config) -> None:
    if peft_config is not None or (not isinstance(model, str) and is_peft_model(model)):
        raise NotImplementedError(
            "ESTrainer with vLLM evolves full weights only; with a PEFT adapter, generate with `use_vllm=False`."
        )
    if args.vllm_mode == "colocate":
        from .backends.vllm_cpu import keep_plain_linear_weights_on_cpu

        keep_plain_linear_weights_on_cpu()  # before GRPOTrainer creates the engine
        if args.perturbation == "lowrank" and args.lowrank_other_parameters != "frozen":
            raise ValueError(
                "With vLLM, low-rank members are LoRA adapters, which perturb only the decoder's Linear projections: "
                "set lowrank_other_parameters='frozen' (embeddings, lm_head, norms and biases then stay fixed), or "
                "generate with model.generate (use_vllm=False), where every parameter evolves."
            )
    elif args.world_size > 1:
        raise NotImplementedError(
            "vllm_mode='server' runs with a single training process for now; launch one process, or use "
            "vllm_mode='colocate'."
        )
    elif args.perturbation == "lowrank":
        raise NotImplementedError(
            "perturbation='lowrank' with vllm_mode='server' is not supported yet: the server's worker draws full-rank "
            "noise. Use vllm_mode='colocate' (each member a LoRA adapter) or model.generate (use_vllm=False)."
        )


def _lora_engine_if_lowrank(args: ESConfig):
    """Low-rank members in a colocated engine are LoRA adapters: the engine TRL creates must enable LoRA, with a slot
    for each member generated in one call."""
    if not (args.use_vllm and args.vllm_mode == "colocate" and args.perturbation == "lowrank"):
        return nullcontext()
    members_per_call = args.population_batch_size or args.population_size // max(args.world_size, 1)
    return lora_enabled_llm(args.lowrank_rank, max_loras=members_per_call)


@contextmanager
def _hidden_from_grpo_if_server(args: ESConfig):
    """GRPOTrainer would connect TRL's NCCL weight-sync client to a server; ES talks to its own worker extension."""
    server = args.use_vllm and args.vllm_mode == "server"
    if server:
        args.use_vllm = False
    try:
        yield
    finally:
        if server:
            args.use_vllm = True


@dataclass
class _MemberEvaluation:
    completions: list  # this process's member's completions
    rewards_per_func: torch.Tensor  # (processes x completions, reward functions): the round's members, gathered
    extra_logs: dict[str, list]


def _as_es_config(args, model) -> ESConfig:
    if isinstance(args, ESConfig):
        return args
    if args is None:
        model_name = model if isinstance(model, str) else model.config._name_or_path
        return ESConfig(f"{Path(str(model_name)).name}-ES")
    if isinstance(args, GRPOConfig):
        es_args = ESConfig.from_grpo_config(args)
        warnings.warn(
            "ESTrainer got a GRPOConfig and converted it to an ESConfig: GRPO's loss settings are ignored and ES "
            f"defaults apply to population_size={es_args.population_size}, sigma={es_args.sigma} and the ES step "
            f"size learning_rate={es_args.learning_rate} (GRPO's learning_rate={args.learning_rate} is an AdamW step "
            "size). Pass an ESConfig to choose them.",
            UserWarning,
            stacklevel=3,
        )
        return es_args
    raise TypeError(f"args must be an ESConfig or a GRPOConfig, got {type(args).__name__}.")


def _member_fitness(completion_rewards: torch.Tensor, reward_func_names: list[str]) -> torch.Tensor:
    """Mean scored reward per member; a member none of whose completions was scored gets the population mean."""
    if torch.isnan(completion_rewards).all():
        raise ValueError(
            f"Every reward function ({', '.join(reward_func_names)}) returned None for every completion of every "
            "member, so ES has no fitness to compare. Make at least one reward function score these prompts."
        )
    fitness = torch.nanmean(completion_rewards, dim=1)
    return torch.where(torch.isnan(fitness), torch.nanmean(fitness), fitness)


def _population_diversity(completion_rewards: torch.Tensor, num_generations: int, success_threshold: float) -> float:
    """Mean over the step's prompts of the members' JS diversity, a completion with a reward above `success_threshold`
    counting as a success: each prompt's `num_generations` consecutive completions estimate a member's success
    probability."""
    members, completions = completion_rewards.shape
    successes = (
        (completion_rewards > success_threshold).float().view(members, completions // num_generations, num_generations)
    )
    success_probs = successes.mean(dim=2).T  # (prompts, members)
    return sum(js_diversity(row.tolist()) for row in success_probs) / len(success_probs)


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
            "'trl_es.arithmetic.extract_answer', with its module on the Python path."
        ) from error


@contextmanager
def _timed(seconds: dict[str, float], phase: str):
    start = time.perf_counter()
    try:
        yield
    finally:
        seconds[phase] += time.perf_counter() - start
