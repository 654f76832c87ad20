"""Every use of vLLM's private API by the server backend (`trl-es vllm-serve`), in one place.

The server is built on vLLM's public surface: its OpenAI server's `--middleware` and `--worker-extension-cls` flags
and `EngineClient.collective_rpc`. What those leave out is reached only through the functions below;
`tests/test_vllm_compat.py` checks each name separately, so a vLLM release that changes one fails one named test (with
the vLLM version in its message), not a training run. (The vLLM-CPU weight shim lives in `vllm_cpu.py`.)
"""

from __future__ import annotations

# The vLLM privates used here, by function (kept in sync with tests/test_vllm_compat.py).
PRIVATE_NAMES = {
    "engine_client_of": ["app.state.engine_client (set by init_app_state)"],
    "worker_model": ["Worker.model_runner.model"],
    "served_model_path": ["Worker.vllm_config.model_config.model"],
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
