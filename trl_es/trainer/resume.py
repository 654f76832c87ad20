"""Checkpoints of an ES run: which checkpoint a resume starts from, the ES state written beside the Trainer's, and
what a resume reads back (the float32 master, the starting weights, the step counters, the `es_optimizer` state),
checked against the model and the settings."""

from __future__ import annotations

import functools
import os
import warnings
from collections import ChainMap
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from ..core.checkpoint import (
    ES_STATE_DIR,
    REFERENCE_FILE,
    check_saved_tensors,
    checkpoint_problem,
    checkpoints,
    float32_model_weights,
    last_complete_checkpoint,
    load_es_state,
    load_optimizer_state,
    save_es_state_copies,
    save_es_state_shares,
)
from ..core.tensor_files import SafetensorsFile
from ..core.update_shards import all_gather_objects
from ..evaluation.metrics import StartingWeights
from .divergence import StepCounters
from .run_settings import changed_run_settings, run_settings

# Warnings name the user's `trainer.train(...)` call.
_AT_THE_CALLER = 6


def resume_checkpoint(resume_from_checkpoint: str | os.PathLike | bool | None, output_dir: str) -> str | None:
    """The checkpoint `train(resume_from_checkpoint=...)` resumes from: with `True`, the last one in `output_dir`
    whose files all parse (skipping, with a warning, any that a crash or a full disk left half-written); a named
    checkpoint that is not complete is refused with the reason."""
    if resume_from_checkpoint is True:
        found = last_complete_checkpoint(output_dir)  # warns about each newer one it skips
        if found is not None:
            return found
        reasons = [f"{path.name}: {problem}" for path, problem in checkpoints(output_dir)]
        raise ValueError(
            f"No complete checkpoint found in output_dir={output_dir!r}"
            + (f" ({'; '.join(reasons)})." if reasons else " (it holds no checkpoint-<step> directory).")
            + " Train without `resume_from_checkpoint`, or point it at a checkpoint directory."
        )
    if isinstance(resume_from_checkpoint, (str, os.PathLike)):
        problem = checkpoint_problem(resume_from_checkpoint)
        if problem is not None:
            raise ValueError(
                f"Cannot resume from {resume_from_checkpoint}: {problem}. Resume from an earlier checkpoint, or pass "
                "`resume_from_checkpoint=True` to pick the last complete one."
            )
    return resume_from_checkpoint or None


def save_run_state(
    output_dir: str, population, reference: StartingWeights | None, metadata: dict, should_save: bool
) -> None:
    """Write a checkpoint's `es_state/` where `should_save`: the float32 master of the parameters the model rounds,
    the starting weights, the whole `es_optimizer` state and `metadata` (see `run_metadata`). Every process calls it:
    with `shard_update` each holds the `es_optimizer` state of the tensors it owns, and the processes of a
    tensor-parallel engine each hold a share of the master. Where one process of several saves (the Trainer's
    default), each owner writes its own share beside the others ([`save_es_state_shares`]); where several save
    (`save_on_each_node`, each on its node's disk), every share is sent to each of them
    ([`save_es_state_copies`]). If any process fails, every process raises, naming it, and no ES state is left."""
    master = population.master
    # A float32 parameter is its own master, saved with the model's weights: only the others' masters are written.
    rounded = [name for name, param in population.parameters.items() if param.dtype != torch.float32]
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    world = torch.distributed.get_world_size() if distributed else 1
    gather = functools.partial(all_gather_objects, size=world)
    saver = {"reference": reference, "metadata": {**metadata, **master.optimizer.metadata()}} if should_save else {}
    if world > 1 and sum(gather(should_save)) == 1:  # one process of several saves: each writes its own share
        masters = master.checkpoint_stream(rounded, keep=should_save, own=True)
        optimizer_state = master.optimizer_stream(population.update_shards, keep=should_save, own=True)
        save_es_state_shares(output_dir, torch.distributed.get_rank(), masters, optimizer_state, gather, **saver)
    else:
        masters = master.checkpoint_stream(rounded, keep=should_save)
        optimizer_state = master.optimizer_stream(population.update_shards, keep=should_save)
        save_es_state_copies(output_dir, masters, optimizer_state, gather, **saver)


def run_metadata(global_step: int, counters: StepCounters, reward_names: list[str], args) -> dict:
    """What a checkpoint records of the run beside its weights: the step, the counters, the reward functions and
    every run setting (a resume compares them)."""
    return {
        "global_step": global_step,
        "skipped_steps": counters.skipped,
        "degenerate_steps": counters.degenerate,
        "reward_funcs": reward_names,
        **run_settings(args),
    }


@dataclass
class ResumedRun:
    """What a resume reads from a checkpoint's ES state: the float32 masters of the parameters the model rounds, the
    run's starting weights, the step counters and the `es_optimizer` state. The tensors are read one at a time as
    they are asked for: a process that keeps a share of the masters and the optimizer state (the processes of a
    tensor-parallel engine, or with `shard_update`) reads its share only."""

    checkpoint: str
    lossy_masters: Mapping[str, torch.Tensor]
    reference: SafetensorsFile  # the checkpoint's starting weights
    counters: StepCounters
    optimizer_state: Mapping[str, torch.Tensor]
    metadata: dict  # es_state.json: the run settings, and the optimizer's number of updates

    @classmethod
    def load(
        cls,
        checkpoint: str,
        parameters: dict[str, torch.nn.Parameter],
        args,
        reward_names: list[str],
        model_loaded: bool = True,
    ):
        """Read and check `checkpoint`'s ES state against the model's evolving `parameters`, warning about every run
        setting that differs from `args` (and the reward functions). With `model_loaded=False` (a process that did not
        load the checkpoint's weights into its model, see [`holds_every_master`]), every master comes from the
        checkpoint's files."""
        lossy_masters, reference, metadata = load_es_state(checkpoint)
        _warn_about_changed_settings(checkpoint, metadata, args, reward_names)
        state_dir = Path(checkpoint) / ES_STATE_DIR
        check_saved_tensors(f"the master files of {state_dir}", lossy_masters, parameters)
        check_saved_tensors(state_dir / REFERENCE_FILE, reference, parameters, complete=True)
        # The model already holds the checkpoint's weights: they are the master wherever they are float32. Where the
        # model now rounds them (a float32 run resumed in bf16), or did not load them, the master comes from the
        # checkpoint's float32 files.
        lossy_masters = ChainMap(
            _float32_masters_from_model_files(checkpoint, parameters, lossy_masters, every=not model_loaded),
            lossy_masters,
        )
        counters = StepCounters(metadata.get("skipped_steps", 0), metadata.get("degenerate_steps", 0))
        return cls(checkpoint, lossy_masters, reference, counters, load_optimizer_state(checkpoint), metadata)


def _warn_about_changed_settings(checkpoint: str, metadata: dict, args, reward_names: list[str]) -> None:
    """Name every run setting (and reward function) that differs from the checkpoint's: the run will not continue
    the original one. A new learning_rate does not even apply: the checkpoint's scheduler is restored."""
    changed = changed_run_settings(metadata, args)
    if "reward_funcs" in metadata and metadata["reward_funcs"] != reward_names:
        changed["reward_funcs"] = (metadata["reward_funcs"], reward_names)
    for name, (saved, current) in changed.items():
        if name == "learning_rate":
            effect = (
                f"the checkpoint's learning-rate scheduler is restored (as by any transformers Trainer), so the "
                f"saved schedule wins and the run continues with learning_rate={saved!r}. To train with "
                f"learning_rate={current!r}, start a new run from the checkpoint's weights (model={checkpoint!r})."
            )
        else:
            effect = (
                f"the run will not continue the original one exactly. Resume with {name}={saved!r} to continue it."
            )
        warnings.warn(
            f"Resuming from {checkpoint}, written with {name}={saved!r}, with {name}={current!r}: {effect}",
            UserWarning,
            stacklevel=_AT_THE_CALLER,
        )


def holds_every_master(checkpoint: str, parameters: dict[str, torch.nn.Parameter]) -> bool:
    """Whether `checkpoint`'s files hold the float32 master of every one of `parameters` (its ES state's masters, and
    the float32 weights of its model files), so that a process that keeps no model need not load its weights to
    resume: a bf16 model's masters are in its ES state, a float32 model's weights are their own. Only headers are
    read."""
    masters = load_es_state(checkpoint)[0]
    others = [name for name in parameters if name not in masters]
    return len(float32_model_weights(checkpoint, others)) == len(others)


def _float32_masters_from_model_files(checkpoint, parameters, lossy_masters, every=False) -> Mapping[str, Tensor]:
    """Float32 masters, read from the checkpoint's weight files as they are asked for, of the parameters that the
    model rounds now (`every`: of all of them) but that the checkpoint saved in float32 (so its ES state holds no
    master for them)."""
    names = [n for n, p in parameters.items() if (every or p.dtype != torch.float32) and n not in lossy_masters]
    if not names:
        return {}
    found = float32_model_weights(checkpoint, names)
    check_saved_tensors(f"the weight files of {checkpoint}", found, parameters)
    missing = [name for name in names if name not in found]
    if missing:
        warnings.warn(
            f"{checkpoint} holds no float32 weights of {len(missing)} parameters the model now holds in "
            f"{parameters[missing[0]].dtype} (e.g. {missing[0]!r}): their master starts from the rounded weights, so "
            "the run does not continue the original one exactly. Resume in the dtype the checkpoint was written in "
            "to continue it.",
            UserWarning,
            stacklevel=_AT_THE_CALLER,
        )
    return found
