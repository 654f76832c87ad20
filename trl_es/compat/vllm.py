"""Every use of vLLM's private API, in one place.

ES writes member weights into a vLLM engine through vLLM's own `model.load_weights` (Hugging Face names in, fused and
tensor-parallel layouts handled by vLLM), and the server backend is built on its OpenAI server's public `--middleware`
and `--worker-extension-cls` flags and `EngineClient.collective_rpc`. What those leave out — where an engine keeps
its model, its LoRA settings and its shutdown, where the server keeps its engine client — is reached only through the
functions below. `tests/compat/test_vllm.py` checks each name separately, so a vLLM release that changes one fails one
named test (with the vLLM version in its message), not a training run. (The vLLM-CPU weight shim is `vllm_cpu.py`.)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

# The vLLM privates used here, by function.
PRIVATE_NAMES = {
    "engine_client_of": ["app.state.engine_client (set by init_app_state)"],
    "worker_model": ["Worker.model_runner.model"],
    "served_model_path": ["Worker.vllm_config.model_config.model"],
    "worker_tensor_parallel_group": [
        "vllm.distributed.get_tp_group().world_size, .device_group",
        "vllm.distributed.model_parallel_is_initialized",
    ],
    "engine_model": ["LLM.llm_engine.model_executor.driver_worker.model_runner.model"],
    "engine_lora_config": ["LLM.llm_engine.vllm_config.lora_config"],
    "shutdown_engine": ["LLM.llm_engine.engine_core.shutdown", "torch.distributed.destroy_process_group (patched)"],
}


def engine_client_of(app):
    """The `EngineClient` of vLLM's OpenAI server app (what its own routes call `collective_rpc` on)."""
    return app.state.engine_client


def worker_model(worker):
    """The `torch.nn.Module` a vLLM worker generates with (its `load_weights` takes Hugging Face names)."""
    return worker.model_runner.model


def served_model_path(worker) -> str:
    """The `--model` the server was started with (a folder or a Hub id)."""
    return worker.vllm_config.model_config.model


def worker_tensor_parallel_group(worker):
    """The process group of the server worker's tensor-parallel engine (one process per rank, the group vLLM's own
    collectives use), or None for an engine on one worker (or a worker outside an engine: a test's stand-in)."""
    from vllm.distributed import get_tp_group, model_parallel_is_initialized

    if not model_parallel_is_initialized():
        return None
    group = get_tp_group()
    return group.device_group if group.world_size > 1 else None


def engine_model(llm) -> torch.nn.Module:
    """The `torch.nn.Module` an in-process `vllm.LLM` generates with (created with
    `distributed_executor_backend="external_launcher"`, as TRL's colocate mode does)."""
    return worker_model(llm.llm_engine.model_executor.driver_worker)


def engine_lora_config(llm):
    """The engine's `LoRAConfig` (`max_lora_rank`, `max_loras`, `lora_dtype`), or None when it was created without
    LoRA."""
    return llm.llm_engine.vllm_config.lora_config


@contextmanager
def in_process_engine(**llm_kwargs) -> Iterator[object]:
    """A `vllm.LLM(**llm_kwargs)` whose engine core runs in this process (as TRL's colocate mode), shut down on exit,
    so that the next engine can start: vLLM holds one in-process engine at a time."""
    import os

    from vllm import LLM

    previous = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process, so that shutdown is now
    try:
        llm = LLM(**llm_kwargs)
    finally:
        if previous is None:
            os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        else:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = previous
    try:
        yield llm
    finally:
        shutdown_engine(llm, keep_default_process_group=torch.distributed.is_initialized())


def shutdown_engine(llm, keep_default_process_group: bool) -> None:
    """Tear an in-process engine down now (executor, KV cache, the process groups it created, the heap it froze for
    the garbage collector), instead of whenever it is collected.

    vLLM's teardown destroys torch.distributed's default process group too, even when Accelerate created it (several
    processes, DeepSpeed) and still counts on it: with `keep_default_process_group`, only the groups vLLM made are
    destroyed.
    """
    with _default_process_group_kept(keep_default_process_group):
        llm.llm_engine.engine_core.shutdown()  # vLLM's EngineCore.shutdown; it detaches the engine's own finalizer


@contextmanager
def _default_process_group_kept(keep: bool) -> Iterator[None]:
    destroy = torch.distributed.destroy_process_group

    def destroy_all_but_the_default(group=None):
        if group is not None:
            destroy(group)

    if keep:
        torch.distributed.destroy_process_group = destroy_all_but_the_default
    try:
        yield
    finally:
        torch.distributed.destroy_process_group = destroy
