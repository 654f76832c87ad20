"""Every use of TRL's private API, in one place.

`GRPOTrainer` gives ES its public surface (constructor, reward functions, config, logging), but a few things it keeps
private have no public equivalent: its reward calculation (reward models, async functions, `log_metric`,
`log_extra`, the gather across processes), the buffers its `log` reads, and how it builds its colocated vLLM engine.
ES reaches them only through the functions below; `tests/test_trl_compat.py` checks each private name separately,
so a TRL release that changes one fails one named test (with the TRL version in its message), not a training run.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

# The TRL privates used here, by function (kept in sync with tests/test_trl_compat.py).
PRIVATE_NAMES = {
    "calculate_rewards": ["GRPOTrainer._calculate_rewards"],
    "take_reward_logs": ["GRPOTrainer._pending_metrics", "GRPOTrainer._pending_extra_logs"],
    "logged_metrics": ["GRPOTrainer._metrics"],
    "completion_table": ["GRPOTrainer._logs"],
    "sync_engine_weights": ["GRPOTrainer._last_loaded_step"],
    "lora_enabled_llm": ["trl.generation.vllm_generation.LLM"],
    "tracker_urls": ["trl.trainer.utils.get_trackio_space_url"],
}


def calculate_rewards(
    trainer, inputs: list[dict], prompts: list, completions: list, completion_ids: list
) -> torch.Tensor:
    """Rewards of this process's completions from every reward function, exactly as GRPO computes them (reward models,
    async functions, dataset columns, `trainer_state`, `log_metric`, `log_extra`; `None` becomes NaN), gathered across
    processes: `(processes x completions, reward functions)`, in process order."""
    return trainer._calculate_rewards(inputs, prompts, completions, completion_ids)


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
