"""Every use of transformers' private API, in one place (tested in `tests/compat/test_transformers.py`).

`Trainer` has no public hook for six things ESTrainer needs: wrapping the train sampler, writing extra state into
each checkpoint, reading it back on resume, choosing what a resume loads into the model, making the model ready
before `load_best_model_at_end` loads into it, and leaving files out of its pushes to the Hub. Its private methods
(and the `HfApi` its pushes upload through) are the hooks; [`TrainerHooks`] overrides them and calls methods with
public names instead. It also gives the wrapped sampler its epoch where the Trainer's own call misses it
([`SamplerEpochs`]), and lets every process that saves write the model's weights ([`saved_by_every_saver`]).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from transformers import TrainerCallback

# The transformers privates used here, by function or class.
PRIVATE_NAMES = {
    "TrainerHooks": [
        "Trainer._get_train_sampler",
        "Trainer._save_optimizer_and_scheduler",
        "Trainer._load_optimizer_and_scheduler",
        "Trainer._push_from_checkpoint",
        "Trainer._load_best_model",
        "Trainer._load_from_checkpoint",
    ],
    "uploads_ignoring": [
        "transformers.trainer.hf_api (what Trainer.push_to_hub and _push_from_checkpoint upload with)"
    ],
    "set_flag_help": ["argparse.ArgumentParser._actions (the flags an HfArgumentParser made of its dataclasses)"],
    "saved_by_every_saver": ["PreTrainedModel.should_save_on_this_rank (what save_pretrained asks before writing)"],
}

# What Trainer writes into `output_dir`: its pickled arguments (also in every checkpoint), and the TensorBoard logs
# (TensorBoardCallback's default folder, `runs/<date>_<host>`).
TRAINING_ARGS_FILE = "training_args.bin"
TENSORBOARD_FOLDER = "runs"


class TrainerHooks:
    """A mixin, placed before the `Trainer` subclass in the bases, that turns six private hooks of transformers'
    `Trainer` into public ones. Override these:

    - `wrap_train_sampler(sampler)`: the sampler training uses, given the one the parent built; if it has
      `set_epoch(epoch)`, that is called as each epoch begins, also the epoch a resume continues ([`SamplerEpochs`]);
    - `save_extra_state(output_dir)`: called in every checkpoint save after the optimizer and scheduler are written
      and before `trainer_state.json` (which the Trainer writes last, so a checkpoint with a Trainer state always has
      this state too);
    - `load_checkpoint_weights(checkpoint, model)`: loads the checkpoint's weights into the model on resume (by
      default as the Trainer does), before the optimizer, the scheduler and the extra state;
    - `load_extra_state(checkpoint)`: called on resume, once the optimizer and scheduler are loaded;
    - `load_best_model_weights()`: loads the best checkpoint's weights into the model at the end of training with
      `load_best_model_at_end` (by default as the Trainer does);
    - `hub_ignore_patterns()`: files of `output_dir` and of a pushed checkpoint that every push to the Hub leaves out
      (`push_to_hub`, and the push at each save with `push_to_hub=True`), besides the Trainer's own `_*` and
      `checkpoint-*`.
    """

    def wrap_train_sampler(self, sampler):
        return sampler

    def save_extra_state(self, output_dir: str) -> None:
        pass

    def load_checkpoint_weights(self, checkpoint: str, model=None) -> None:
        super()._load_from_checkpoint(checkpoint, model)

    def load_extra_state(self, checkpoint: str) -> None:
        pass

    def load_best_model_weights(self) -> None:
        super()._load_best_model()

    def hub_ignore_patterns(self) -> list[str]:
        """By default, `training_args.bin` (a pickle: unsafe to load from a stranger, and holding this machine's paths)
        and the TensorBoard logs (`runs/`) unless `args.hub_push_logs` asks for them."""
        logs = [] if getattr(self.args, "hub_push_logs", False) else [f"{TENSORBOARD_FOLDER}/"]
        return [TRAINING_ARGS_FILE, f"*/{TRAINING_ARGS_FILE}", *logs]

    def push_to_hub(self, *args, **kwargs):
        with uploads_ignoring(self.hub_ignore_patterns()):
            return super().push_to_hub(*args, **kwargs)

    def _push_from_checkpoint(self, checkpoint_folder: str) -> None:
        with uploads_ignoring(self.hub_ignore_patterns()):
            super()._push_from_checkpoint(checkpoint_folder)

    def _get_train_sampler(self, *args, **kwargs):
        sampler = self.wrap_train_sampler(super()._get_train_sampler(*args, **kwargs))
        self.callback_handler.pop_callback(SamplerEpochs)  # the sampler of an earlier `train()`, if any
        if hasattr(sampler, "set_epoch"):
            self.add_callback(SamplerEpochs(sampler))
        return sampler

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        super()._save_optimizer_and_scheduler(output_dir)
        self.save_extra_state(output_dir)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is not None:
            self.load_extra_state(checkpoint)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        self.load_checkpoint_weights(resume_from_checkpoint, model)

    def _load_best_model(self) -> None:
        self.load_best_model_weights()


class SamplerEpochs(TrainerCallback):
    """Calls `sampler.set_epoch(epoch)` as each epoch of training begins, with the epoch the Trainer runs next: the
    whole part of `state.epoch`, which a resume reads from the checkpoint (2.5 halfway through epoch 2).

    Accelerate's `DataLoaderShard.set_epoch` looks for `set_epoch` on its batch sampler, that one's `sampler` and its
    `batch_sampler.sampler`, and transformers adds `batch_sampler.batch_sampler`. With several processes the sampler
    sits in a `BatchSampler` in a `BatchSamplerShard`, within reach; a resume in the middle of an epoch
    (`skip_first_batches`) puts a `SkipBatchSampler` over them, out of reach of both, and the resumed epoch would
    replay the sampler's previous order: epoch 0's, in a fresh process.
    """

    def __init__(self, sampler):
        self.sampler = sampler

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.sampler.set_epoch(int(state.epoch))


@contextmanager
def uploads_ignoring(patterns: list[str]) -> Iterator[None]:
    """Within this context, every folder that `Trainer.push_to_hub` and `Trainer._push_from_checkpoint` upload leaves
    out the files matching `patterns` (`huggingface_hub` patterns: `"runs/"` is the folder, `"*/x"` x at any depth),
    besides those the Trainer names itself.

    Both upload with `transformers.trainer.hf_api().upload_folder(..., ignore_patterns=...)`, which has no argument
    for more patterns; this replaces that module's `hf_api` by one whose `upload_folder` adds them, and restores it on
    exit. A checkpoint's upload runs in the background, but its files are chosen when it is called, inside the context.
    """
    import transformers.trainer as trainer_module

    shared_api = trainer_module.hf_api

    def api_ignoring_patterns():
        return _UploadsIgnoring(shared_api(), patterns)

    trainer_module.hf_api = api_ignoring_patterns
    try:
        yield
    finally:
        trainer_module.hf_api = shared_api


class _UploadsIgnoring:
    """An `HfApi` whose `upload_folder` also ignores `patterns`; every other attribute is the wrapped API's."""

    def __init__(self, api, patterns: list[str]):
        self.api, self.patterns = api, list(patterns)

    def upload_folder(self, *args, ignore_patterns: list[str] | str | None = None, **kwargs):
        return self.api.upload_folder(*args, ignore_patterns=with_patterns(ignore_patterns, self.patterns), **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.api, name)


def with_patterns(given: list[str] | str | None, more: list[str]) -> list[str]:
    """`upload_folder`'s `ignore_patterns` argument (None, one pattern or a list) with `more` added, as a new list
    (`upload_folder` appends to the list it is given)."""
    given = [given] if isinstance(given, str) else list(given or ())
    return [*given, *(pattern for pattern in more if pattern not in given)]


@contextmanager
def saved_by_every_saver(model, saves: bool) -> Iterator[None]:
    """Within this context `model.save_pretrained` writes the weights wherever the Trainer saves (`saves`: its
    `args.should_save`).

    Once torch.distributed is initialized, transformers' `save_pretrained` writes only on global rank 0
    (`should_save_on_this_rank`), whatever the Trainer decided: with `save_on_each_node`, the checkpoints of every
    other machine got the tokenizer and the ES state but no model weights, and a resume there was refused. This gives
    the model an instance attribute of that name that keeps only `save_pretrained`'s own `is_main_process`, and removes
    it on exit."""
    if not saves:
        yield
        return
    model.should_save_on_this_rank = lambda is_main_process: is_main_process
    try:
        yield
    finally:
        del model.should_save_on_this_rank


def set_flag_help(parser, dest: str, help_text: str) -> None:
    """Give the flag of `parser` (an `HfArgumentParser`, such as TRL's `TrlParser`) that sets the field `dest` the
    help `help_text`. HfArgumentParser takes each flag's help from its dataclass field (a library's, for
    `TrainingArguments`' fields), and argparse has no public way to change an argument once added."""
    actions = [action for action in parser._actions if action.dest == dest]
    if not actions:
        raise ValueError(f"The parser has no flag for the field {dest!r}.")
    for action in actions:
        action.help = help_text
