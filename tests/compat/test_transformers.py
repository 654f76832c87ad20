"""The transformers privates that trl-es uses (through `trl_es.compat.transformers`): a release that renames or
reorders one fails here, with the transformers version in the message."""

import inspect

import transformers
from transformers import Trainer

from trl_es.compat.transformers import TrainerHooks

TRANSFORMERS = f"transformers {transformers.__version__}"


def test_trainer_hooks_override_private_methods_the_trainer_still_has():
    for name, parameters in [
        ("_get_train_sampler", ["self", "train_dataset"]),
        ("_save_optimizer_and_scheduler", ["self", "output_dir"]),
        ("_load_optimizer_and_scheduler", ["self", "checkpoint"]),
    ]:
        method = getattr(Trainer, name, None)
        assert method is not None, f"{TRANSFORMERS} has no Trainer.{name}; update trl_es.compat.transformers"
        assert list(inspect.signature(method).parameters)[: len(parameters)] == parameters, (
            f"{TRANSFORMERS} changed Trainer.{name}{inspect.signature(method)}; update TrainerHooks"
        )
        assert name in vars(TrainerHooks)


def test_a_checkpoint_saves_the_optimizer_before_its_trainer_state():
    """TrainerHooks.save_extra_state relies on it: a checkpoint with `trainer_state.json` has the extra state too."""
    source = inspect.getsource(Trainer._save_checkpoint)
    hook, state = source.find("self._save_optimizer_and_scheduler("), source.find("self.state.save_to_json(")
    assert -1 < hook < state, f"{TRANSFORMERS} writes trainer_state.json before the optimizer; see TrainerHooks"


def test_resuming_loads_the_optimizer_and_scheduler_through_the_hook():
    assert "self._load_optimizer_and_scheduler(resume_from_checkpoint)" in inspect.getsource(Trainer), (
        f"{TRANSFORMERS} no longer resumes through Trainer._load_optimizer_and_scheduler; update TrainerHooks"
    )
