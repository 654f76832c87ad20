"""How [`ESTrainer`] saves and loads checkpoints: the Trainer's checkpoint hooks (`compat.transformers.TrainerHooks`)
filled in for ES. What an ES checkpoint holds beside the Trainer's files, and how a resume reads it, is `resume.py`.

A mixin of [`ESTrainer`]: it reads the run state that `ESTrainer.train` sets (`_population`, `_reference`,
`_counters`, `_noise_scale`) and sets it again from a checkpoint on resume.
"""

from __future__ import annotations

import functools

import torch

from ..backends.population import evolving_parameters
from ..compat.transformers import saved_by_every_saver
from ..core.guards import check_finite_tensors
from ..evaluation.metrics import StartingWeights
from . import resume
from .noise_scale import NoiseScale
from .released_model import load_checkpoint_into_model, loads_checkpoint_weights


class CheckpointHooks:
    """Placed before `TrainerHooks` in [`ESTrainer`]'s bases: each checkpoint gets the ES state, refuses non-finite
    weights, and a resume (or `load_best_model_at_end`) continues the checkpoint's float32 master."""

    def load_best_model_weights(self) -> None:
        """As the Trainer loads the best checkpoint's weights at the end of training, except in a process that keeps
        no model: as on resume (`load_checkpoint_weights`)."""
        best = self.state.best_model_checkpoint
        load_checkpoint_into_model(self, best, super().load_best_model_weights)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """As [`~transformers.Trainer.save_model`] (also how every checkpoint writes its weights), but weights holding
        NaN or infinity are refused with a `NonFiniteError` before anything is written, and with `save_on_each_node`
        every machine's checkpoint gets the weights (transformers writes them on global rank 0 only)."""
        model = self.accelerator.unwrap_model(self.model)
        check_finite_tensors(
            dict(model.named_parameters()), f"The weights to be saved to {output_dir or self.args.output_dir}"
        )
        with saved_by_every_saver(model, self.args.should_save):  # every machine's, with `save_on_each_node`
            super().save_model(output_dir, _internal_call)

    def save_extra_state(self, output_dir: str) -> None:
        """Each checkpoint's `es_state/`, written before `trainer_state.json` (which the Trainer writes last): a
        checkpoint with a Trainer state always has its ES state."""
        if self._population is not None:
            metadata = resume.run_metadata(self.state.global_step, self._counters, self.reward_func_names, self.args)
            metadata |= self._noise_scale.state()
            resume.save_run_state(output_dir, self._population, self._reference, metadata, self.args.should_save)

    def load_checkpoint_weights(self, checkpoint: str, model=None) -> None:
        """As the Trainer loads a checkpoint's weights on resume, except in a process that keeps no model (it releases
        it): there only the weights that do not evolve, where the checkpoint's files hold every evolving one's float32
        master (its population reads its share of them)."""
        trainer_load = functools.partial(super().load_checkpoint_weights, checkpoint, model)
        load_checkpoint_into_model(self, checkpoint, trainer_load, model)

    def load_extra_state(self, checkpoint: str) -> None:
        resumed = resume.ResumedRun.load(
            checkpoint,
            self._evolving_parameters(),
            self.args,
            self.reward_func_names,
            model_loaded=loads_checkpoint_weights(self, checkpoint),
        )
        self._population = None
        self._resumed = resumed  # a vLLM server rebuilds its master from the same files
        self._reference = StartingWeights.resumed(resumed.reference) if self.args.should_save else None
        self._counters = resumed.counters
        self._noise_scale = NoiseScale.resumed(self.args, resumed.metadata)

    def _evolving_parameters(self) -> dict[str, torch.nn.Parameter]:
        return evolving_parameters(self.accelerator.unwrap_model(self.model))
