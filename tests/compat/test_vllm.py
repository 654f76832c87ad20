"""One test per vLLM name that trl-es relies on (private ones all through `trl_es.compat.vllm`): a vLLM release that
renames or reshapes one fails the test named after it, with the vLLM version in the message. The colocate tests
(`tests/backends/test_vllm_colocate.py`) run the same functions on a real engine."""

import inspect

from scripts.server_vllm_required import require_module

vllm = require_module("vllm")

from trl_es.compat import vllm as vllm_compat  # noqa: E402

VLLM = f"vLLM {vllm.__version__}"


def test_vllm_app_state_engine_client():
    """`engine_client_of`: `app.state.engine_client`, which vLLM's `init_app_state` sets."""
    from vllm.entrypoints.launchers.api_server.app_state import init_app_state

    assert "state.engine_client = engine_client" in inspect.getsource(init_app_state), (
        f"{VLLM}: init_app_state no longer sets app.state.engine_client; update trl_es.compat.vllm.engine_client_of"
    )


def test_vllm_worker_model_runner_model():
    """`worker_model`: `Worker.model_runner.model`."""
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner
    from vllm.v1.worker.cpu_worker import CPUWorker

    assert "self.model_runner" in inspect.getsource(CPUWorker), f"{VLLM}: workers have no model_runner"
    assert "self.model = " in inspect.getsource(CPUModelRunner.load_model), (
        f"{VLLM}: the model runner no longer keeps its model in .model; update trl_es.compat.vllm.worker_model"
    )


def test_vllm_worker_vllm_config_model():
    """`served_model_path`: `Worker.vllm_config.model_config.model`."""
    from vllm.config import ModelConfig
    from vllm.v1.worker.worker_base import WorkerBase

    assert "self.vllm_config = vllm_config" in inspect.getsource(WorkerBase.__init__), f"{VLLM}: no worker.vllm_config"
    assert "model" in ModelConfig.__dataclass_fields__, f"{VLLM}: ModelConfig has no field `model`"


def test_vllm_distributed_get_tp_group_world_size_device_group():
    """`worker_tensor_parallel_group`: `vllm.distributed.get_tp_group()`, a `GroupCoordinator` with `world_size` and
    `device_group` (the torch process group of the engine's tensor-parallel ranks), once
    `model_parallel_is_initialized()`."""
    from vllm.distributed import GroupCoordinator, get_tp_group, model_parallel_is_initialized

    assert inspect.signature(get_tp_group).return_annotation in (GroupCoordinator, "GroupCoordinator"), VLLM
    assert not inspect.signature(model_parallel_is_initialized).parameters, VLLM
    source = inspect.getsource(GroupCoordinator.__init__)
    assert "self.world_size =" in source and "self.device_group =" in source, (
        f"{VLLM}: GroupCoordinator no longer sets world_size and device_group; update "
        "trl_es.compat.vllm.worker_tensor_parallel_group"
    )


def test_vllm_server_takes_middleware_and_worker_extension_flags():
    """Public, but everything rests on them: `--middleware` mounts the control channel, `--worker-extension-cls` the
    ES methods, and `EngineClient.collective_rpc` carries the calls from one to the other."""
    from vllm.engine.protocol import EngineClient
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = make_arg_parser(FlexibleArgumentParser()).parse_args(
        ["--middleware", "a.B", "--worker-extension-cls", "c.D"]
    )
    assert args.middleware == ["a.B"] and args.worker_extension_cls == "c.D", VLLM
    assert "args" in inspect.signature(EngineClient.collective_rpc).parameters, VLLM


def test_vllm_llm_keeps_its_engine_model_behind_the_driver_worker():
    """`engine_model`: `LLM.llm_engine.model_executor.driver_worker.model_runner.model`."""
    from vllm import LLM
    from vllm.v1.engine.llm_engine import LLMEngine
    from vllm.v1.executor.uniproc_executor import UniProcExecutor

    assert "self.llm_engine = " in inspect.getsource(LLM.__init__), f"{VLLM}: LLM has no llm_engine"
    assert "self.model_executor = " in inspect.getsource(LLMEngine.__init__), (
        f"{VLLM}: LLMEngine has no model_executor"
    )
    assert "self.driver_worker = " in inspect.getsource(UniProcExecutor), (
        f"{VLLM}: the in-process executor has no driver_worker; update trl_es.compat.vllm.engine_model"
    )


def test_vllm_engine_config_holds_the_lora_config():
    """`engine_lora_config`: `LLM.llm_engine.vllm_config.lora_config`."""
    from vllm.config import LoRAConfig, VllmConfig
    from vllm.v1.engine.llm_engine import LLMEngine

    assert "self.vllm_config = vllm_config" in inspect.getsource(LLMEngine.__init__), f"{VLLM}: no vllm_config"
    assert "lora_config" in VllmConfig.__dataclass_fields__, f"{VLLM}: VllmConfig has no lora_config"
    assert {"max_lora_rank", "max_loras", "lora_dtype"} <= set(LoRAConfig.__dataclass_fields__), (
        f"{VLLM} renamed LoRAConfig's fields; update trl_es.backends.vllm_lora"
    )


def test_vllm_in_process_engine_core_shuts_down_and_destroys_process_groups():
    """`shutdown_engine`: `LLM.llm_engine.engine_core.shutdown()`, whose teardown calls
    `torch.distributed.destroy_process_group`, which the function keeps from destroying the default group."""
    import torch
    from vllm.v1.engine.core_client import InprocClient

    assert callable(getattr(InprocClient, "shutdown", None)), f"{VLLM}: the in-process engine core has no shutdown"
    destroyed = []
    original = torch.distributed.destroy_process_group
    torch.distributed.destroy_process_group = lambda group=None: destroyed.append(group)
    try:
        with vllm_compat._default_process_group_kept(keep=True):
            torch.distributed.destroy_process_group()
            torch.distributed.destroy_process_group("a group vLLM made")
    finally:
        torch.distributed.destroy_process_group = original
    assert destroyed == ["a group vLLM made"], "shutdown_engine must keep the default process group"
    assert callable(vllm_compat.shutdown_engine)
