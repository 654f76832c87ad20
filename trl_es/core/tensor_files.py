"""Tensors of safetensors files, read by name: a process that keeps a share of a model reads only that share.

A worker of a tensor-parallel engine owns the master of some tensors only. Reading whole files (`load_file`) put the
whole checkpoint in host memory once per worker before it kept its share: eight copies of a 70B model on a node of
eight GPUs. The headers say every tensor's shape without reading it, which is all ownership needs.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors import safe_open

from .sharded_master import EngineShards


class TensorFiles:
    """Where each tensor of `files` lies; a tensor in several files is read from the last (a checkpoint listed after
    the model it was trained from overrides it).

    Args:
        files (`list[str | os.PathLike]`): The safetensors files, in order.
    """

    def __init__(self, files: Iterable[str | os.PathLike]):
        self.file_of: dict[str, Path] = {}
        self.shapes: dict[str, torch.Size] = {}
        for file in files:
            with safe_open(file, framework="pt") as handle:
                for name in handle.keys():
                    self.file_of[name] = Path(file)
                    self.shapes[name] = torch.Size(handle.get_slice(name).get_shape())

    def __contains__(self, name: str) -> bool:
        return name in self.file_of

    def read(self, names: Iterable[str]) -> dict[str, torch.Tensor]:
        """The tensors `names`, in that order, each read from its file alone (opened once per file)."""
        names = list(names)
        by_file: dict[Path, list[str]] = {}
        for name in names:
            by_file.setdefault(self.file_of[name], []).append(name)
        tensors = {}
        for file, in_file in by_file.items():
            with safe_open(file, framework="pt") as handle:
                tensors.update({name: handle.get_tensor(name) for name in in_file})
        return {name: tensors[name] for name in names}


def read_master_share(
    weights: TensorFiles,
    names: list[str],
    dtype: torch.dtype,
    shards: EngineShards | None = None,
    masters: TensorFiles | None = None,
) -> dict[str, torch.Tensor]:
    """The starting tensors of a master of the parameters `names`, in host memory: read from `weights` and rounded
    through the trainer's parameter `dtype` (so that the trainer's master and this one start equal), or the float32
    masters of a checkpoint, `masters`, where it holds them.

    With `shards`, only the tensors this process owns are read; the others are their shapes on the meta device,
    which holds no memory ([`ShardedMasterWeights`] keeps their names and shapes only).
    """
    kept = names if shards is None else [name for name in names if shards.owns(name)]
    tensors = {name: tensor.to(dtype=dtype) for name, tensor in weights.read(kept).items()}
    if masters is not None:
        tensors.update(masters.read(name for name in kept if name in masters))
    return {name: tensors.get(name, _on_meta(weights.shapes[name], dtype)) for name in names}


def read_state_share(state: TensorFiles, master: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The optimizer state tensors (`<parameter>.<suffix>`) of `state`, less those of the parameters that `master`
    holds on the meta device (another process owns them); what is read is checked by `restore_optimizer`."""
    others = {name for name, tensor in master.items() if tensor.is_meta}
    return state.read(key for key in state.file_of if key.rsplit(".", 1)[0] not in others)


def _on_meta(shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")
