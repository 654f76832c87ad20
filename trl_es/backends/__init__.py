"""How a population is evaluated: every backend implements `PopulationBackend` (`base.py`): it generates with each
member's weights, or the centre's, and follows the master's updates. `population.py` picks the backend for a
configuration, once.

The names below are imported on first use, so that a module of this package that needs neither torch nor
transformers (`control_channel`, which `trl-es vllm-serve` reads before it starts vLLM) imports neither.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# public name -> the module that defines it
_EXPORTS = {
    "PhaseTimer": ".base",
    "PopulationBackend": ".base",
    "HFBackend": ".hf",
    "Population": ".population",
    "build_population": ".population",
}

__all__ = ["HFBackend", "PhaseTimer", "Population", "PopulationBackend", "build_population"]

if TYPE_CHECKING:
    from .base import PhaseTimer, PopulationBackend
    from .hf import HFBackend
    from .population import Population, build_population


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'trl_es.backends' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
