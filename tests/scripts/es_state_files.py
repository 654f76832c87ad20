"""A checkpoint's ES state as its files hold it: every share that `es_state.json` lists, one file per process that
wrote one."""

from pathlib import Path

import torch
from safetensors.torch import load_file

from trl_es.core.checkpoint import SHARES, es_state_files


def saved_shares(checkpoint: Path, kind: str = "master") -> dict[str, dict[str, torch.Tensor]]:
    """`{file name: its tensors}` of each `kind` file ("master" or "optimizer") the checkpoint lists."""
    return {file.name: load_file(file) for file in es_state_files(checkpoint)[SHARES.index(kind)]}


def saved_es_state(checkpoint: Path, kind: str = "master") -> dict[str, torch.Tensor]:
    """Every `kind` tensor of the checkpoint, from all its shares; a tensor in two shares fails."""
    tensors = {}
    for file, share in saved_shares(checkpoint, kind).items():
        assert not share.keys() & tensors.keys(), f"{file} repeats {sorted(share.keys() & tensors.keys())[:3]}"
        tensors.update(share)
    return tensors
