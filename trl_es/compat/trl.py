"""Every use of TRL's private API, and every patch of its behaviour, in one place.

`GRPOTrainer` gives ES its public surface (constructor, reward functions, config, logging), but a few things it keeps
private have no public equivalent: its reward calculation (reward models, async functions, `log_metric`,
`log_extra`, the gather across processes), the buffers its `log` reads, how it builds its colocated vLLM engine, and
the tags it gives the model. And `GRPOConfig` / `GRPOTrainer.__init__` make choices that only GRPO's loss needs
(a group of at least two completions, a reference model when `beta != 0`, an NCCL client for a vLLM server), which ES
steps around here. `tests/compat/test_trl.py` checks each name separately, so a TRL release that changes one fails
one named test (with the TRL version in its message), not a training run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from .vllm import shutdown_engine

# The TRL privates used here, by function (kept in sync with tests/compat/test_trl.py).
PRIVATE_NAMES = {
    "calculate_rewards": ["GRPOTrainer._calculate_rewards"],
    "take_reward_logs": ["GRPOTrainer._pending_metrics", "GRPOTrainer._pending_extra_logs"],
    "logged_metrics": ["GRPOTrainer._metrics"],
    "completion_table": ["GRPOTrainer._logs"],
    "sync_engine_weights": ["GRPOTrainer._last_loaded_step"],
    "lora_enabled_llm": ["trl.generation.vllm_generation.LLM"],
    "tracker_urls": ["trl.trainer.utils.get_trackio_space_url"],
    "TrainerTags": ["GRPOTrainer._tag_names"],
    "one_completion_per_prompt_accepted": ["GRPOConfig.__post_init__ (its num_generations >= 2 check)"],
    "grpo_init_sees_defaults": ["GRPOTrainer.__init__ (what it builds from the loss fields)"],
    "vllm_server_hidden_from_grpo": ["GRPOTrainer.__init__ (its VLLMGeneration for use_vllm)"],
    "colocated_engine": ["VLLMGeneration.llm"],
    "release_colocated_engine": ["VLLMGeneration.llm"],
    "async_event_loop": ["GRPOTrainer.async_loop"],
    "set_reward_environments": ["GRPOTrainer.environments (read by _calculate_rewards)"],
}


def calculate_rewards(
    trainer, inputs: list[dict], prompts: list, completions: list, completion_ids: list
) -> torch.Tensor:
    """Rewards of this process's completions from every reward function, exactly as GRPO computes them (reward models,
    async functions, dataset columns, `trainer_state`, `log_metric`, `log_extra`; `None` becomes NaN), gathered across
    processes: `(processes x completions, reward functions)`, in process order."""
    return trainer._calculate_rewards(inputs, prompts, completions, completion_ids)


def async_event_loop(trainer) -> Callable[[list], list] | None:
    """A function that runs coroutines to completion on the event loop GRPOTrainer starts (on a daemon thread) when a
    reward function or a tool is async, returning their results or exceptions; None when it started none."""
    loop = getattr(trainer, "async_loop", None)
    if loop is None:
        return None

    def run(coroutines: list) -> list:
        async def gather():
            return await asyncio.gather(*coroutines, return_exceptions=True)

        return asyncio.run_coroutine_threadsafe(gather(), loop).result()

    return run


def set_reward_environments(trainer, environments: list | None) -> None:
    """The environment instances GRPO's reward calculation passes to reward functions as `environments` (one per
    completion), and its environment-owned rewards (`get_reward`) read: a member's, before its completions are
    scored. They stay set afterwards, as GRPO leaves its last batch's."""
    trainer.environments = environments


def take_reward_logs(trainer) -> tuple[dict[str, list[float]], dict[str, list]]:
    """What the reward functions logged since the last call (`log_metric` scalars, `log_extra` columns), cleared."""
    metrics, columns = dict(trainer._pending_metrics), dict(trainer._pending_extra_logs)
    trainer._pending_metrics.clear()
    trainer._pending_extra_logs.clear()
    return metrics, columns


def logged_metrics(trainer, mode: str) -> dict[str, list[float]]:
    """The lists of values that GRPO's `log` averages into the next log entry (`mode`: `"train"` or `"eval"`)."""
    return trainer._metrics[mode]


def completion_table(trainer) -> dict:
    """GRPO's table of logged completions (`log_completions`): `prompt`, `completion`, `rewards`, `advantages`,
    `extra` columns."""
    return trainer._logs


def sync_engine_weights(trainer) -> None:
    """Push a `GRPOTrainer`'s policy into its colocated vLLM engine if its step changed since the last push, as GRPO
    does before it generates (GRPO itself only does so at its next generation)."""
    if trainer.state.global_step != trainer._last_loaded_step:
        trainer.vllm_generation.sync_weights()
        trainer._last_loaded_step = trainer.state.global_step


@contextmanager
def lora_enabled_llm(max_lora_rank: int, max_loras: int) -> Iterator[None]:
    """Within this context, the colocated engine that TRL's `VLLMGeneration` creates has LoRA enabled.

    TRL builds its `vllm.LLM` inside `VLLMGeneration._init_vllm` (called from `GRPOTrainer.__init__`) without LoRA
    arguments; this replaces the `LLM` name of `trl.generation.vllm_generation` by one that adds
    `enable_lora=True, max_lora_rank=..., max_loras=...`, and restores it on exit.

    Args:
        max_lora_rank (`int`):
            A rank vLLM accepts (1, 8, 16, ...; see `trl_es.backends.vllm_lora.vllm_lora_rank`).
        max_loras (`int`):
            Adapters in one batch: the members evaluated per `generate` call. A larger population is generated in
            chunks of `max_loras` members.
    """
    from trl.generation import vllm_generation

    original = vllm_generation.LLM
    lora_arguments = {"enable_lora": True, "max_lora_rank": max_lora_rank, "max_loras": max_loras}

    def llm_with_lora(*args, **kwargs):
        return original(*args, **{**kwargs, **lora_arguments})

    vllm_generation.LLM = llm_with_lora
    try:
        yield
    finally:
        vllm_generation.LLM = original


def tracker_urls() -> dict[str, str | None]:
    """The running experiment's pages, as GRPOTrainer's model card links them: `{"wandb_url": ..., "trackio_url": ...}`
    (None where that tracker is not running). TRL finds the Trackio Space URL with a helper of its `trainer.utils`."""
    from transformers import is_wandb_available
    from trl.trainer.utils import get_trackio_space_url

    wandb_url = None
    if is_wandb_available():
        import wandb

        wandb_url = wandb.run.url if wandb.run is not None else None
    return {"wandb_url": wandb_url, "trackio_url": get_trackio_space_url()}


class TrainerTags:
    """A mixin, placed before the TRL trainer in the bases, that sets the tags TRL gives the model
    (`model.add_model_tags`, in `GRPOTrainer.__init__`) and its card from the public class attribute `model_tags`
    (TRL reads them from `_tag_names`)."""

    model_tags: tuple[str, ...] = ()

    @property
    def _tag_names(self) -> list[str]:
        return list(self.model_tags)


class _OneCompletionPerPrompt(int):
    """Stands in for `num_generations=1` while GRPOConfig validates: it passes GRPO's group-size check and, like 1,
    divides every batch size."""

    def __new__(cls):
        return super().__new__(cls, 2)

    def __rmod__(self, other):
        return 0


@contextmanager
def one_completion_per_prompt_accepted(config) -> Iterator[None]:
    """Within this context, `GRPOConfig.__post_init__` accepts `config.num_generations == 1`.

    GRPOConfig rejects fewer than two completions per prompt because GRPO's advantages need a group; ES scores members,
    not completions, so one is valid. The value is restored on exit.
    """
    num_generations = config.num_generations
    if num_generations == 1:
        config.num_generations = _OneCompletionPerPrompt()
    try:
        yield
    finally:
        config.num_generations = num_generations


@contextmanager
def grpo_init_sees_defaults(config, defaults: dict[str, object]) -> Iterator[None]:
    """Within this context, the fields of `config` named in `defaults` hold those values; the user's values are
    restored on exit, so the config still reports them.

    `GRPOTrainer.__init__` reads GRPO's loss fields to build what only GRPO's loss uses (with `beta != 0`, a reference
    model: a second copy of the model; with a PEFT model, a "ref" adapter) and to warn about loss-type combinations.
    A trainer that uses none of it builds its parent inside this context, with GRPOConfig's defaults (`beta=0`).
    """
    user_values = {name: getattr(config, name) for name in defaults}
    for name, value in defaults.items():
        setattr(config, name, value)
    try:
        yield
    finally:
        for name, value in user_values.items():
            setattr(config, name, value)


@contextmanager
def vllm_server_hidden_from_grpo(config) -> Iterator[None]:
    """Within this context, a config with `use_vllm=True, vllm_mode="server"` shows `use_vllm=False`, so that
    `GRPOTrainer.__init__` builds no `VLLMGeneration` (its NCCL weight-sync client would connect to the server; ES
    talks to its own worker extension instead). Restored on exit."""
    hidden = config.use_vllm and config.vllm_mode == "server"
    if hidden:
        config.use_vllm = False
    try:
        yield
    finally:
        if hidden:
            config.use_vllm = True


def release_colocated_engine(trainer) -> bool:
    """Shut down the colocated vLLM engine that TRL's `VLLMGeneration` built for `trainer` (an ESTrainer or
    GRPOTrainer) now, and detach it from the trainer; returns whether there was one.

    vLLM tears an in-process engine down only when the engine is collected. If anything still holds the trainer when
    the next engine starts, the two engines share vLLM's process groups, and collecting the first one later destroys
    them under the second ("pipeline model parallel group is not initialized"). Shutting down here runs that teardown
    once, now, keeping torch.distributed's default group when Accelerate created it.
    """
    from accelerate.state import PartialState

    llm = colocated_engine(trainer)
    if llm is None:
        return False
    keep_default_group = torch.distributed.is_initialized() and PartialState().backend is not None
    shutdown_engine(llm, keep_default_process_group=keep_default_group)
    trainer.vllm_generation.llm = None
    return True


def colocated_engine(trainer):
    """The `vllm.LLM` that TRL's `VLLMGeneration` built for `trainer` in colocate mode, or None (no vLLM, server mode,
    or released)."""
    return getattr(getattr(trainer, "vllm_generation", None), "llm", None)


def colocated_engine_group(trainer):
    """The process group of the tensor-parallel colocated engine TRL built for `trainer` (its `tp_group`, the
    processes that share the engine), or None with one process per engine."""
    generation = getattr(trainer, "vllm_generation", None)
    if generation is None or getattr(generation, "tensor_parallel_size", 1) == 1:
        return None
    return generation.tp_group
