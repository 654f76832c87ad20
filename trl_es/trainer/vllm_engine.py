"""Releasing a trainer's colocated vLLM engine, so that another trainer can start its own in this process (the next
stage of a `SequentialTrainer`, the next test module)."""

from __future__ import annotations

from ..compat.trl import release_colocated_engine
from .es_trainer import ESTrainer


def release_vllm_engine(trainer) -> None:
    """Shut down the colocated vLLM engine of `trainer` (an ESTrainer or GRPOTrainer) now, rather than whenever the
    trainer is collected (see `trl_es.compat.trl.release_colocated_engine`). A trainer without one is left as it is."""
    if release_colocated_engine(trainer) and isinstance(trainer, ESTrainer):
        trainer.release_population()  # its backend holds the engine's model
