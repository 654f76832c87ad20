"""One test per vLLM name that the server backend relies on (private ones all through `trl_es.backends.vllm_compat`):
a vLLM release that renames or reshapes one fails the test named after it, with the vLLM version in the message."""

import inspect

from scripts.server_vllm_required import require_module

vllm = require_module("vllm")

from trl_es.backends import vllm_compat  # noqa: E402

VLLM = f"vLLM {vllm.__version__}"


def test_private_names_are_listed_where_the_code_uses_them():
    source = inspect.getsource(vllm_compat)
    for function, names in vllm_compat.PRIVATE_NAMES.items():
        assert callable(getattr(vllm_compat, function)), function
        for name in names:
            assert name.split(" ")[0].rsplit(".", 1)[-1] in source, (function, name)


def test_vllm_app_state_engine_client():
    from vllm.entrypoints.launchers.api_server.app_state import init_app_state

    assert "state.engine_client = engine_client" in inspect.getsource(init_app_state), (
        f"{VLLM}: init_app_state no longer sets app.state.engine_client; update vllm_compat.engine_client_of"
    )


def test_vllm_worker_model_runner_model():
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner
    from vllm.v1.worker.cpu_worker import CPUWorker

    assert "self.model_runner" in inspect.getsource(CPUWorker), f"{VLLM}: workers have no model_runner"
    assert "self.model = " in inspect.getsource(CPUModelRunner.load_model), (
        f"{VLLM}: the model runner no longer keeps its model in .model; update vllm_compat.worker_model"
    )


def test_vllm_worker_vllm_config_model():
    from vllm.config import ModelConfig
    from vllm.v1.worker.worker_base import WorkerBase

    assert "self.vllm_config = vllm_config" in inspect.getsource(WorkerBase.__init__), f"{VLLM}: no worker.vllm_config"
    assert "model" in ModelConfig.__dataclass_fields__, f"{VLLM}: ModelConfig has no field `model`"


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
