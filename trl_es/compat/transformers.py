"""Every use of transformers' private API, in one place (tested in `tests/compat/test_transformers.py`).

`Trainer` has no public hook for three things ESTrainer needs: wrapping the train sampler, writing extra state into
each checkpoint, and reading it back on resume. Its private methods are the hooks; [`TrainerHooks`] overrides them and
calls methods with public names instead.
"""

from __future__ import annotations

# The transformers privates used here, by function or class.
PRIVATE_NAMES = {
    "TrainerHooks": [
        "Trainer._get_train_sampler",
        "Trainer._save_optimizer_and_scheduler",
        "Trainer._load_optimizer_and_scheduler",
    ],
}


class TrainerHooks:
    """A mixin, placed before the `Trainer` subclass in the bases, that turns three private hooks of transformers'
    `Trainer` into public ones. Override these:

    - `wrap_train_sampler(sampler)`: the sampler training uses, given the one the parent built;
    - `save_extra_state(output_dir)`: called in every checkpoint save after the optimizer and scheduler are written
      and before `trainer_state.json` (which the Trainer writes last, so a checkpoint with a Trainer state always has
      this state too);
    - `load_extra_state(checkpoint)`: called on resume, once the optimizer and scheduler are loaded.
    """

    def wrap_train_sampler(self, sampler):
        return sampler

    def save_extra_state(self, output_dir: str) -> None:
        pass

    def load_extra_state(self, checkpoint: str) -> None:
        pass

    def _get_train_sampler(self, *args, **kwargs):
        return self.wrap_train_sampler(super()._get_train_sampler(*args, **kwargs))

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        super()._save_optimizer_and_scheduler(output_dir)
        self.save_extra_state(output_dir)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is not None:
            self.load_extra_state(checkpoint)
