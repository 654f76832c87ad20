"""Work-around for vLLM-CPU, which empties the weights of Linear layers after loading them.

vLLM-CPU repacks each unquantized Linear weight for oneDNN and replaces `layer.weight` with an empty tensor, so
writing member weights in place silently does nothing and `load_weights` raises. Dispatching every Linear layer to
`torch.nn.functional.linear` on its plain weight keeps the weights where ES writes them. It must be applied in the
process that loads the model, before loading; it is applied only on the CPU platform. Tested in
`tests/compat/test_vllm_cpu.py`.
"""

from __future__ import annotations

import torch

# The vLLM privates used here, by function.
PRIVATE_NAMES = {
    "keep_plain_linear_weights_on_cpu": [
        "vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm (replaced)",
        "layer.cpu_linear",
    ],
}

_applied = False


def _plain_linear(x, weight, bias):
    return torch.nn.functional.linear(x, weight, bias)


def _keep_plain_weights(layer: torch.nn.Module, remove_weight: bool) -> None:
    layer.cpu_linear = _plain_linear


def is_vllm_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def keep_plain_linear_weights_on_cpu() -> bool:
    """Apply the work-around if vLLM runs on the CPU platform; returns whether it is (now) applied."""
    global _applied
    if _applied:
        return True
    if not is_vllm_cpu():
        return False
    from vllm.model_executor.layers import utils

    utils.dispatch_cpu_unquantized_gemm = _keep_plain_weights
    _applied = True
    return True
