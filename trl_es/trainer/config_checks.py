"""Every check of an `ESConfig`, run once when it is built (`ESConfig.__post_init__`): the one place a configuration
is validated. Trainers and backends read the config; they do not check it again.

Each error names the value and says how to fix it. `check_before_grpo` runs before `GRPOConfig.__post_init__` (so a
bad ES value is named before GRPO's own checks trip over it), `check_after_grpo` after it, once the number of
processes, the DeepSpeed plugin and FSDP are known.
"""

from __future__ import annotations

import importlib
import math
import os
import warnings
from collections.abc import Callable

from accelerate.utils import parse_flag_from_env

from ..backends.server_urls import check_server_urls
from ..core.direction_optimizer import DirectionOptimizerSettings
from ..core.distributed import check_population_divides
from ..core.fitness import FITNESS_SHAPINGS
from ..core.guards import FLOAT32_MAX, is_float32_finite
from ..core.kl_anchor import check_beta
from ..core.lowrank import OTHER_PARAMETERS
from ..core.sigma_schedule import SIGMA_SCHEDULES
from .grpo_conversion import grpo_loss_settings

PERTURBATIONS = ("full", "lowrank")
MASTER_DTYPES = ("float32", "compensated_bfloat16")

# Warnings point at the user's `ESConfig(...)` call: warn <- check <- check_before_grpo (or check_after_grpo) <-
# __post_init__ <- __init__.
_AT_THE_CALLER = 5


def check_before_grpo(config) -> None:
    _check_es_fields(config)
    _check_numbers_the_update_uses(config)
    _check_seeds_and_lengths(config)
    _check_generation(config)
    _warn_about_grpo_only_fields(config)
    import_function(config.eval_answer_extractor, "eval_answer_extractor")  # fails now, not at the first evaluation


def check_again_at_train(config) -> None:
    """The ES fields' checks once more when training starts: a field set after construction (`trainer.args.sigma =
    ...`) is checked like one given to the constructor (issue 27: it was not checked at all)."""
    _check_es_fields(config)
    _check_numbers_the_update_uses(config)
    _check_seeds_and_lengths(config)


def check_after_grpo(config) -> None:
    """The checks that need the launch: processes, DeepSpeed and FSDP, and the backend combinations they allow."""
    if config.steps_per_generation != config.gradient_accumulation_steps:
        _one_prompt_batch_per_update(config)
    if config.deepspeed_plugin is not None:
        raise NotImplementedError(
            "ESTrainer does not run under DeepSpeed: ES keeps no gradients or optimizer state for ZeRO to shard, "
            "and ZeRO-3 would shard the weights that every member perturbs. Launch ES stages without DeepSpeed, "
            "e.g. with examples/accelerate_configs/multi_gpu.yaml."
        )
    # `accelerate launch` with an FSDP config sets the variable; Accelerate reads it with this function
    if config.fsdp_plugin_args is not None or parse_flag_from_env("ACCELERATE_USE_FSDP"):
        if config.fsdp_plugin_args is not None:
            setting = f"fsdp={config.fsdp!r}"
        else:
            setting = f"ACCELERATE_USE_FSDP={os.environ['ACCELERATE_USE_FSDP']}"
        raise NotImplementedError(
            f"ESTrainer does not run under FSDP ({setting}): ES keeps no gradients or optimizer state for FSDP to "
            "shard, and FSDP would shard the weights that every member perturbs. For a model larger than one GPU, "
            "generate with vLLM and set vllm_tensor_parallel_size (an engine's processes split the master between "
            "them) and, if needed, offload_master=True; launch ES stages without FSDP, e.g. with "
            "examples/accelerate_configs/multi_gpu.yaml."
        )
    _check_backend(config)
    check_population_divides(config.population_size, config.world_size, engine_group_size(config))


def _one_prompt_batch_per_update(config) -> None:
    """GRPO can generate once for several optimizer steps (`steps_per_generation` > `gradient_accumulation_steps`,
    or the `generation_batch_size` that implies it); ES makes one update per prompt batch, so it generates once per
    step, on the batch that `gradient_accumulation_steps` gives."""
    asked = (
        f"steps_per_generation={config.steps_per_generation} (generation_batch_size={config.generation_batch_size})"
    )
    config.steps_per_generation = config.gradient_accumulation_steps
    config.generation_batch_size = config.per_device_train_batch_size * config.world_size * config.steps_per_generation
    if config.generation_batch_size % config.num_generations:
        raise ValueError(
            f"ESTrainer makes one update per prompt batch of per_device_train_batch_size x "
            f"gradient_accumulation_steps x processes = {config.generation_batch_size} completions, which must be "
            f"divisible by num_generations ({config.num_generations}). Change per_device_train_batch_size or "
            "gradient_accumulation_steps, and leave steps_per_generation and generation_batch_size unset."
        )
    warnings.warn(
        f"ESTrainer makes one update per prompt batch, so {asked} becomes steps_per_generation="
        f"gradient_accumulation_steps={config.gradient_accumulation_steps}: every member of an ES step answers the "
        f"same batch of per_device_train_batch_size x gradient_accumulation_steps x processes = "
        f"{config.generation_batch_size} completions ({config.prompts_per_step} prompts x num_generations="
        f"{config.num_generations}), drawn anew for every update. For more prompts per update, raise "
        "per_device_train_batch_size or gradient_accumulation_steps.",
        UserWarning,
        stacklevel=_AT_THE_CALLER,
    )


def import_function(path: str | None, field_name: str) -> Callable | None:
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


def _check_es_fields(config) -> None:
    check_beta(config.kl_anchor_beta)
    probe_size = config.kl_anchor_probe_size
    if isinstance(probe_size, bool) or not isinstance(probe_size, int) or probe_size < 1:
        raise ValueError(f"kl_anchor_probe_size must be an integer >= 1 (prompts in the probe), got {probe_size!r}.")
    population_size = config.population_size
    if not isinstance(population_size, int) or population_size < 2:
        raise ValueError(
            f"population_size must be an integer >= 2 (ES compares members), got {population_size!r}. "
            "The anchor papers use 16 to 30."
        )
    if config.antithetic and population_size % 2:
        raise ValueError(
            f"antithetic=True pairs members as (+eps, -eps), so population_size must be even; got "
            f"{population_size}. Use {population_size + 1} or set antithetic=False."
        )
    if not (isinstance(config.sigma, (int, float)) and math.isfinite(config.sigma) and config.sigma > 0):
        raise ValueError(f"sigma must be a finite number > 0, got {config.sigma!r}. The anchor paper uses 1e-3.")
    _check_sigma_changes(config)
    if config.fitness_shaping not in FITNESS_SHAPINGS:
        raise ValueError(
            f"Unknown fitness_shaping={config.fitness_shaping!r}; use one of {', '.join(FITNESS_SHAPINGS)}."
        )
    DirectionOptimizerSettings(  # refuses an unknown optimizer or a constant out of range, naming the field
        config.es_optimizer, config.es_momentum, config.adam_beta1, config.adam_beta2, config.adam_epsilon
    )
    if config.perturbation not in PERTURBATIONS:
        raise ValueError(f"Unknown perturbation={config.perturbation!r}; use one of {', '.join(PERTURBATIONS)}.")
    if not isinstance(config.lowrank_rank, int) or config.lowrank_rank < 1:
        raise ValueError(f"lowrank_rank must be an integer >= 1, got {config.lowrank_rank!r}. EGGROLL uses 1.")
    if config.lowrank_other_parameters not in OTHER_PARAMETERS:
        raise ValueError(
            f"Unknown lowrank_other_parameters={config.lowrank_other_parameters!r}; use one of "
            f"{', '.join(OTHER_PARAMETERS)}."
        )
    if config.master_dtype not in MASTER_DTYPES:
        raise ValueError(f"Unknown master_dtype={config.master_dtype!r}; use one of {', '.join(MASTER_DTYPES)}.")
    if config.master_dtype != "float32" and (config.perturbation == "lowrank" or _uses_server(config)):
        raise NotImplementedError(
            f"master_dtype={config.master_dtype!r} works with full-rank members generated by model.generate or a "
            f"colocated vLLM engine (here perturbation={config.perturbation!r}, vllm_mode="
            f"{config.vllm_mode if config.use_vllm else None!r}: a low-rank master and a vLLM server's worker keep "
            "float32 masters). Use master_dtype='float32'."
        )
    if config.offload_master and (config.perturbation == "lowrank" or config.master_dtype != "float32"):
        raise NotImplementedError(
            f"offload_master=True keeps a full-rank float32 master in host memory (here perturbation="
            f"{config.perturbation!r}, master_dtype={config.master_dtype!r}). Use perturbation='full' and "
            "master_dtype='float32' with it, or offload_master=False."
        )
    batch = config.population_batch_size
    if batch is not None and (not isinstance(batch, int) or batch < 1):
        raise ValueError(
            f"population_batch_size must be an integer >= 1 (members per generate call), got {batch!r}. Leave it "
            "unset to generate all of a process's members at once."
        )
    if config.consistency_check_steps < 0:
        raise ValueError(
            f"consistency_check_steps must be >= 0 (0 disables the check), got {config.consistency_check_steps!r}."
        )


def _check_sigma_changes(config) -> None:
    """sigma_schedule and its final value, or the adaptive sigma's target and rate (one or the other)."""
    schedule, final = config.sigma_schedule, config.sigma_final
    if schedule not in SIGMA_SCHEDULES:
        raise ValueError(f"Unknown sigma_schedule={schedule!r}; use one of {', '.join(SIGMA_SCHEDULES)}.")
    if schedule != "constant" and not (_positive_finite(final) and is_float32_finite(final)):
        raise ValueError(
            f"sigma_schedule={schedule!r} moves sigma to sigma_final at the last step; sigma_final must be a finite "
            f"number > 0, got {final!r}. E.g. sigma_final={config.sigma / 4:g} for a quarter of sigma."
        )
    target = config.sigma_target_js_diversity
    if target is None:
        return
    if not (_positive_finite(target) and target <= 1):
        raise ValueError(
            f"sigma_target_js_diversity must lie in (0, 1] (JS diversity is in bits), got {target!r}; e.g. 0.1."
        )
    if schedule != "constant":
        raise ValueError(
            f"sigma_target_js_diversity={target} adapts sigma and sigma_schedule={schedule!r} schedules it: use one. "
            "Set sigma_schedule='constant' to adapt, or sigma_target_js_diversity=None to schedule."
        )
    if not _positive_finite(config.sigma_adaptation_rate):
        raise ValueError(
            f"sigma_adaptation_rate must be a finite number > 0, got {config.sigma_adaptation_rate!r}; e.g. 0.1."
        )


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _positive_finite(value) -> bool:
    return _number(value) and value > 0


def _check_numbers_the_update_uses(config) -> None:
    """Every number the ES update multiplies the float32 weights by must be finite in float32 (issue 16: a NaN
    weight_decay or learning_rate=1e39 made every weight NaN, and training "succeeded")."""
    sigma, learning_rate, weight_decay = config.sigma, config.learning_rate, config.weight_decay
    if not (isinstance(sigma, (int, float)) and is_float32_finite(sigma)):
        raise ValueError(f"sigma={sigma!r} overflows float32, the precision of the noise. Use e.g. 1e-3.")
    if not (isinstance(learning_rate, (int, float)) and is_float32_finite(learning_rate)) or learning_rate < 0:
        raise ValueError(
            f"learning_rate (the ES step size) must be a finite number >= 0 that float32 can hold (up to "
            f"{FLOAT32_MAX:.3g}), got {learning_rate!r}. The anchor paper uses 5e-4."
        )
    if not (isinstance(weight_decay, (int, float)) and is_float32_finite(weight_decay)) or weight_decay < 0:
        raise ValueError(f"weight_decay must be a finite number >= 0, got {weight_decay!r}. 0 disables it.")
    if learning_rate * weight_decay >= 1:
        raise ValueError(
            f"learning_rate * weight_decay = {learning_rate} * {weight_decay} >= 1: every step would multiply the "
            "weights by 1 - learning_rate * weight_decay <= 0. Lower weight_decay."
        )
    if learning_rate >= 1:
        warnings.warn(
            f"learning_rate={learning_rate} is the ES step size: every step moves each weight by about "
            "learning_rate times a unit-variance direction, which erases what a trained model knows. The anchor "
            "paper uses 5e-4.",
            UserWarning,
            stacklevel=_AT_THE_CALLER,
        )
    weights = config.reward_weights or []
    if any(not isinstance(w, (int, float)) or not is_float32_finite(w) for w in weights):
        raise ValueError(f"reward_weights must be finite numbers, got {config.reward_weights!r}.")


def _check_seeds_and_lengths(config) -> None:
    """Values that transformers or numpy would only refuse once training starts."""
    for name in ("seed", "data_seed"):
        value = getattr(config, name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**32):
            raise ValueError(
                f"{name} must be an integer in [0, 2**32 - 1] (numpy's seed range), got {value!r}. E.g. {name}=42."
            )
    if config.noise_seed is not None and (not isinstance(config.noise_seed, int) or config.noise_seed < 0):
        raise ValueError(
            f"noise_seed must be an integer >= 0 (it is hashed, so any size works), got {config.noise_seed!r}."
        )
    length = config.max_completion_length
    if length is not None and (not isinstance(length, int) or length < 1):
        raise ValueError(
            f"max_completion_length must be an integer >= 1 (tokens generated per completion), got {length!r}."
        )


def _check_generation(config) -> None:
    if config.temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 decodes greedily), got {config.temperature!r}.")
    # Out of range, each was accepted and left to the backend (issue 27: top_p=5 trained silently)
    if not (_number(config.top_p) and 0 < config.top_p <= 1):
        raise ValueError(f"top_p must be a number in (0, 1] (1 keeps every token), got {config.top_p!r}.")
    if config.min_p is not None and not (_number(config.min_p) and 0 <= config.min_p <= 1):
        raise ValueError(f"min_p must be a number in [0, 1] or None, got {config.min_p!r}.")
    if not (isinstance(config.top_k, int) and not isinstance(config.top_k, bool) and config.top_k >= -1):
        raise ValueError(f"top_k must be an integer >= 0 (0 or -1 keep every token), got {config.top_k!r}.")
    if not (_number(config.repetition_penalty) and config.repetition_penalty > 0):
        raise ValueError(
            f"repetition_penalty must be a number > 0 (1 changes nothing), got {config.repetition_penalty!r}."
        )
    eval_ks = config.eval_ks
    if eval_ks is not None and (not eval_ks or any(not isinstance(k, int) or k < 1 for k in eval_ks)):
        raise ValueError(f"eval_ks must be a non-empty list of integers >= 1 (e.g. [1, 4, 16]), got {eval_ks!r}.")
    if config.eval_temperature <= 0:
        raise ValueError(
            f"eval_temperature must be > 0 (Pass@k needs sampled completions), got {config.eval_temperature!r}."
        )
    num_generations = config.num_generations
    if num_generations is None or num_generations < 1:
        raise ValueError(f"num_generations must be >= 1, got {num_generations!r}.")
    pass_k = config.fitness_pass_at_k
    if pass_k is not None and (isinstance(pass_k, bool) or not isinstance(pass_k, int) or pass_k < 1):
        raise ValueError(f"fitness_pass_at_k must be an integer >= 1 or None, got {pass_k!r}.")
    if pass_k is not None and pass_k > num_generations:
        raise ValueError(
            f"fitness_pass_at_k={pass_k} needs at least {pass_k} completions of each prompt per member, but "
            f"num_generations={num_generations}. Set num_generations >= {pass_k} (with temperature > 0)."
        )
    if num_generations > 1 and config.temperature == 0:
        warnings.warn(
            f"num_generations={num_generations} with greedy decoding (temperature=0) produces {num_generations} "
            "identical completions per prompt. Set temperature > 0 to sample, or num_generations=1.",
            UserWarning,
            stacklevel=_AT_THE_CALLER,
        )


def engine_group_size(config) -> int:
    """Processes that share one engine and evaluate members together: a colocated engine's tensor-parallel group."""
    colocated = config.use_vllm and config.vllm_mode == "colocate"
    return config.vllm_tensor_parallel_size if colocated else 1


def splits_master(config) -> bool:
    """Whether the training processes split the master between them, each tensor's on one owner, instead of each
    holding all of it: the processes of a tensor-parallel colocated engine; in server mode, with `shard_update`, every
    training process (the servers keep masters of their own, so only the process that saves needs the centre)."""
    return engine_group_size(config) > 1 or (_uses_server(config) and config.world_size > 1 and config.shard_update)


def _uses_server(config) -> bool:
    return bool(config.use_vllm and config.vllm_mode == "server")


def _check_backend(config) -> None:
    """The combinations of generation settings that no backend supports, with what to use instead (the choice of
    backend itself is `trl_es.backends.population.build_population`'s)."""
    if config.kl_anchor_beta and (config.use_vllm or config.perturbation == "lowrank"):
        raise NotImplementedError(
            f"kl_anchor_beta={config.kl_anchor_beta} reads each member's log-probabilities from the trainer's model, "
            f"which only full-rank members generating with model.generate use (here use_vllm={config.use_vllm}, "
            f"perturbation={config.perturbation!r}). Set use_vllm=False and perturbation='full', or kl_anchor_beta=0."
        )
    if not config.use_vllm:
        return
    if config.vllm_mode == "colocate":
        tensor_parallel = config.vllm_tensor_parallel_size
        if tensor_parallel > 1 and config.perturbation == "lowrank":
            raise NotImplementedError(
                f"perturbation='lowrank' with vllm_tensor_parallel_size={tensor_parallel} is not supported yet "
                "(the processes of an engine would each write their own adapter files). Use perturbation='full', or "
                "vllm_tensor_parallel_size=1."
            )
        # The processes of an engine split the float32 master between them; the compensated one is not split yet.
        if tensor_parallel > 1 and config.master_dtype != "float32":
            raise NotImplementedError(
                f"vllm_tensor_parallel_size={tensor_parallel} splits the float32 master between the engine's "
                f"processes, which master_dtype={config.master_dtype!r} does not support yet: use "
                "master_dtype='float32', or vllm_tensor_parallel_size=1."
            )
        if tensor_parallel > 1 and config.world_size % tensor_parallel:
            raise ValueError(
                f"vllm_tensor_parallel_size={tensor_parallel} must divide the number of processes "
                f"({config.world_size}): each group of {tensor_parallel} processes shares one engine. Launch a "
                f"multiple of {tensor_parallel} processes."
            )
        if config.perturbation == "lowrank" and config.lowrank_other_parameters != "frozen":
            raise ValueError(
                "With vLLM, low-rank members are LoRA adapters, which perturb only the decoder's Linear projections: "
                "set lowrank_other_parameters='frozen' (embeddings, lm_head, norms and biases then stay fixed), or "
                "generate with model.generate (use_vllm=False), where every parameter evolves."
            )
    elif config.perturbation == "lowrank":
        raise NotImplementedError(
            "perturbation='lowrank' with vllm_mode='server' is not supported yet: the server's worker draws full-rank "
            "noise. Use vllm_mode='colocate' (each member a LoRA adapter) or model.generate (use_vllm=False)."
        )
    else:
        check_server_urls(config.vllm_server_urls, config.world_size)


def _warn_about_grpo_only_fields(config) -> None:
    ignored = grpo_loss_settings(config)
    if ignored:
        warnings.warn(
            f"ESTrainer ignores GRPO loss settings: {', '.join(ignored)}. ES has no policy-gradient loss and no "
            "KL penalty, so no reference model is built; remove them or use GRPOTrainer.",
            UserWarning,
            stacklevel=_AT_THE_CALLER - 1,
        )
