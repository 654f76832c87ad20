"""trl-es: Evolution Strategies post-training for LLMs, as a drop-in for TRL's GRPOTrainer.

The public names are importable from here, as TRL's are (`from trl_es import ESConfig, ESTrainer`); each is imported
on first use, so `import trl_es` stays cheap (no TRL, transformers or vLLM import until a name is needed).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from ._version import __version__

# public name -> the module that defines it
_EXPORTS = {
    "ESConfig": "trl_es.trainer.es_config",
    "ESTrainer": "trl_es.trainer.es_trainer",
    "TrainingPreempted": "trl_es.trainer.preemption",
    "OutputDirInUseError": "trl_es.trainer.output_lock",
    "SequentialTrainer": "trl_es.sequential.trainer",
    "Stage": "trl_es.sequential.trainer",
    "CoverageEvalCallback": "trl_es.trainer.callbacks",
    "EvolmConfig": "trl_es.evolm.config",
    "EvolmTrainer": "trl_es.evolm.trainer",
    "CoverageReport": "trl_es.evaluation.coverage",
    "coverage_report": "trl_es.evaluation.coverage",
    "pass_at_k": "trl_es.evaluation.metrics",
    "maj_at_k": "trl_es.evaluation.metrics",
    "js_diversity": "trl_es.evaluation.metrics",
    "benchmark_dataset": "trl_es.evaluation.benchmarks",
    "math_verify_judge": "trl_es.evaluation.benchmarks",
    "PopulationBackend": "trl_es.backends.base",
}

__all__ = [
    "CoverageEvalCallback",
    "CoverageReport",
    "ESConfig",
    "ESTrainer",
    "EvolmConfig",
    "EvolmTrainer",
    "OutputDirInUseError",
    "PopulationBackend",
    "SequentialTrainer",
    "Stage",
    "TrainingPreempted",
    "__version__",
    "benchmark_dataset",
    "coverage_report",
    "js_diversity",
    "maj_at_k",
    "math_verify_judge",
    "pass_at_k",
]

if TYPE_CHECKING:
    from .backends.base import PopulationBackend
    from .evaluation.benchmarks import benchmark_dataset, math_verify_judge
    from .evaluation.coverage import CoverageReport, coverage_report
    from .evaluation.metrics import js_diversity, maj_at_k, pass_at_k
    from .evolm.config import EvolmConfig
    from .evolm.trainer import EvolmTrainer
    from .sequential.trainer import SequentialTrainer, Stage
    from .trainer.callbacks import CoverageEvalCallback
    from .trainer.es_config import ESConfig
    from .trainer.es_trainer import ESTrainer
    from .trainer.output_lock import OutputDirInUseError
    from .trainer.preemption import TrainingPreempted


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'trl_es' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
