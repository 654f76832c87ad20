"""Tensors of safetensors files, read by name: a process that keeps a share of a model or of its ES state reads only
that share.

The processes of a tensor-parallel engine (and, with `shard_update`, the processes that share the update) each keep
the master or the `es_optimizer` state of some tensors only. Reading whole files (`load_file`) put all of it in host
memory once per process before each kept its share: for a 70B model on a node of eight, eight copies of its 140 GB of
weights at a server's start, and of its 280 GB master and 560 GB adam state at a resume. The headers say every
tensor's shape and dtype without reading it, which is all ownership and the checks need.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Protocol

import torch

# The dtype names of safetensors headers.
SAFETENSORS_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
TORCH_DTYPES = {name: dtype for dtype, name in SAFETENSORS_DTYPES.items()}


class StoredTensors(Mapping[str, torch.Tensor]):
    """Tensors kept in files, by name, each read when asked for; their `shapes` and `dtypes` come from the headers,
    so a mapping of this kind is checked and listed without reading a tensor."""

    shapes: dict[str, torch.Size]
    dtypes: dict[str, torch.dtype]

    def __contains__(self, name: object) -> bool:  # Mapping's would read the tensor
        return name in self.shapes

    def __iter__(self) -> Iterator[str]:
        return iter(self.shapes)

    def __len__(self) -> int:
        return len(self.shapes)


class SafetensorsFile(StoredTensors):
    """The tensors of one safetensors file by name, each read when asked for with plain file I/O (as a CPU tensor,
    bitwise in its stored dtype): the file is never mapped into the process, so reading tensors one at a time holds
    one tensor at a time. (`safe_open` maps the file, and every tensor read through one handle stays resident until
    the handle closes.)

    Args:
        path (`str` or `os.PathLike`): The file.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        with open(self.path, "rb") as file:
            header_size = int.from_bytes(file.read(8), "little")
            header = json.loads(file.read(header_size))
        header.pop("__metadata__", None)
        self._data_start = 8 + header_size
        self._entries = header
        self.shapes = {name: torch.Size(entry["shape"]) for name, entry in header.items()}
        self.dtypes = {name: TORCH_DTYPES[entry["dtype"]] for name, entry in header.items()}

    def __getitem__(self, name: str) -> torch.Tensor:
        begin, end = self._entries[name]["data_offsets"]
        if begin == end:
            return torch.empty(self.shapes[name], dtype=self.dtypes[name])
        data = bytearray(end - begin)
        with open(self.path, "rb") as file:
            file.seek(self._data_start + begin)
            if file.readinto(data) != len(data):
                raise ValueError(f"{self.path} ends inside tensor {name!r}: it was cut off while being written.")
        return torch.frombuffer(data, dtype=self.dtypes[name]).reshape(self.shapes[name])


class TensorFiles(StoredTensors):
    """The tensors of safetensors `files` by name, each read from its file when asked for (names, shapes and dtypes
    come from the headers; see [`SafetensorsFile`]). A tensor in several files is read from the last: a checkpoint
    listed after the model it was trained from overrides it.

    Args:
        files (`list[str | os.PathLike]`): The safetensors files, in order.
    """

    def __init__(self, files: Iterable[str | os.PathLike]):
        self._file_of: dict[str, SafetensorsFile] = {}
        for path in files:
            file = SafetensorsFile(path)
            self._file_of.update(dict.fromkeys(file, file))
        self.shapes = {name: file.shapes[name] for name, file in self._file_of.items()}
        self.dtypes = {name: file.dtypes[name] for name, file in self._file_of.items()}

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._file_of[name][name]

    def read(self, names: Iterable[str]) -> dict[str, torch.Tensor]:
        """The tensors `names`, in that order."""
        return {name: self[name] for name in names}

    def only(self, names: Iterable[str]) -> TensorFiles:
        """The tensors of `names` that the files hold, still read when asked for."""
        chosen = TensorFiles([])
        chosen._file_of = {name: self._file_of[name] for name in names if name in self._file_of}
        chosen.shapes = {name: self.shapes[name] for name in chosen._file_of}
        chosen.dtypes = {name: self.dtypes[name] for name in chosen._file_of}
        return chosen


def shapes_and_dtypes(tensors: Mapping[str, torch.Tensor]) -> dict[str, tuple[torch.Size, torch.dtype]]:
    """Each tensor's shape and dtype: from the headers of [`StoredTensors`] (nothing read), else from the tensors."""
    if isinstance(tensors, StoredTensors):
        return {name: (tensors.shapes[name], tensors.dtypes[name]) for name in tensors}
    return {name: (tensor.shape, tensor.dtype) for name, tensor in tensors.items()}


class Owners(Protocol):
    """Who keeps which tensor: [`EngineShards`] for the processes of a tensor-parallel engine."""

    def owns(self, name: str) -> bool: ...


def read_master_share(
    weights: TensorFiles,
    names: list[str],
    dtype: torch.dtype,
    shards: Owners | None = None,
    masters: TensorFiles | None = None,
) -> dict[str, torch.Tensor]:
    """The starting tensors of a master of the parameters `names`, in host memory: read from `weights` and rounded
    through the trainer's parameter `dtype` (so that the trainer's master and this one start equal), or the float32
    masters of a checkpoint, `masters`, where it holds them.

    With `shards`, only the tensors this process owns are read; the others are their shapes on the meta device,
    which holds no memory ([`ShardedMasterWeights`] keeps their names and shapes only).
    """
    masters = masters if masters is not None else {}
    tensors = {}
    for name in names if shards is None else [name for name in names if shards.owns(name)]:
        # One tensor at a time, and the weights of a tensor whose master was saved are not read.
        tensors[name] = masters[name] if name in masters else weights[name].to(dtype=dtype)
    return {name: tensors.get(name, _on_meta(weights.shapes[name], dtype)) for name in names}


def _on_meta(shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")
