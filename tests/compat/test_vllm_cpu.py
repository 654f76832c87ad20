"""The vLLM-CPU privates that trl-es patches (through `trl_es.compat.vllm_cpu`): a vLLM release that changes how CPU
Linear layers dispatch fails here, with the vLLM version in the message. `tests/backends/test_vllm_colocate.py` shows
the effect on a real engine (a perturbation reaches generation)."""

import inspect

from scripts.server_vllm_required import require_module

vllm = require_module("vllm")

from vllm.model_executor.layers import utils  # noqa: E402

from trl_es.compat import vllm_cpu  # noqa: E402

VLLM = f"vLLM {vllm.__version__}"


def test_cpu_linear_layers_dispatch_through_the_patched_function():
    parameters = list(inspect.signature(utils.dispatch_cpu_unquantized_gemm).parameters)
    assert parameters[:2] == ["layer", "remove_weight"], (
        f"{VLLM} changed dispatch_cpu_unquantized_gemm{parameters}; update keep_plain_linear_weights_on_cpu"
    )
    assert "layer.cpu_linear(" in inspect.getsource(utils), f"{VLLM}: CPU Linear layers no longer call cpu_linear"


def test_the_patch_keeps_a_layers_plain_weight():
    import torch

    assert vllm_cpu.keep_plain_linear_weights_on_cpu() is vllm_cpu.is_vllm_cpu()
    if not vllm_cpu.is_vllm_cpu():
        return  # a GPU build of vLLM needs no patch
    layer = torch.nn.Linear(4, 3)
    utils.dispatch_cpu_unquantized_gemm(layer, remove_weight=True)
    assert layer.weight.numel() == 12, f"{VLLM}: the patched dispatch emptied the weight"
    x = torch.randn(2, 4)
    torch.testing.assert_close(layer.cpu_linear(x, layer.weight, layer.bias), layer(x))
