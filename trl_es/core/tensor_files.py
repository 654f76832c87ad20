"""Tensors of safetensors files, read by name and written one at a time: a process that keeps a share of a model or
of its ES state reads only that share, and a checkpoint's ES state is written as its tensors arrive from their owners.

The processes of a tensor-parallel engine (and, with `shard_update`, the processes that share the update) each keep
the master or the `es_optimizer` state of some tensors only. Reading whole files (`load_file`) put all of it in host
memory once per process before each kept its share: for a 70B model on a node of eight, eight copies of its 140 GB of
weights at a server's start, and of its 280 GB master and 560 GB adam state at a resume. The headers say every
tensor's shape and dtype without reading it, which is all ownership and the checks need.

Writing had the same flaw: `save_file` takes every tensor at once, so a checkpoint gathered a split master and its adam
state whole, on the accelerator of the process that saves (840 GB for 70B, where a GPU has 80). [`write_safetensors`]
writes the header from the tensors' shapes and dtypes, known beforehand, then each tensor as it comes, so the writer
holds one at a time.
"""

from __future__ import annotations

import json
import math
import os
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import NamedTuple, Protocol

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
        self.copies: list[Path] = []  # other files that hold these tensors (those `write_to` wrote), to link
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

    def write_to(self, path: str | os.PathLike) -> None:
        """Put a file holding these tensors at `path`: a hard link to this file, or to a copy an earlier call wrote,
        where one is still there on the same filesystem; else a copy written one tensor at a time
        ([`write_safetensors`]), remembered for the next call. A run's starting weights never change, so its
        checkpoints share one file on disk: for 70B in bf16, 140 GB written once instead of at every save. A file
        already at `path` is replaced, never written through (it may be such a link)."""
        path = Path(path)
        path.unlink(missing_ok=True)
        for source in (*reversed(self.copies), self.path):
            try:
                os.link(source, path)
                return
            except OSError:  # another filesystem, or a checkpoint deleted since (`save_total_limit`)
                continue
        write_safetensors(path, TensorStream.of(self))
        self.copies.append(path)


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


class TensorStream(NamedTuple):
    """Named tensors to write one at a time: each one's shape and dtype beforehand (`layout`, in file order; a
    safetensors header comes first), and the tensors as they are produced (`tensors`: e.g. each sent by its owner when
    the writer asks for it). A process that writes nothing still iterates `tensors` where producing them is collective
    ([`drain`])."""

    layout: dict[str, tuple[torch.Size, torch.dtype]]
    tensors: Iterable[tuple[str, torch.Tensor]]

    @classmethod
    def of(cls, tensors: Mapping[str, torch.Tensor]) -> TensorStream:
        """The tensors of a mapping, each read when the writer asks for it ([`StoredTensors`] read one at a time)."""
        return cls(shapes_and_dtypes(tensors), ((name, tensors[name]) for name in tensors))


def drain(stream: TensorStream) -> None:
    """Iterate `stream` to its end, keeping nothing: a process's part in the collectives that produce it."""
    deque(stream.tensors, maxlen=0)


def write_safetensors(path: str | os.PathLike, stream: TensorStream) -> None:
    """Write `stream` to the safetensors file `path`, one tensor at a time: the header from `stream.layout`, then each
    tensor at its place as it arrives (in any order), moved to host memory there. Holds one tensor at a time.

    A tensor that is not in the layout, or not of its shape and dtype, is a `ValueError` naming it, and so is a
    tensor of the layout that never came. On any error the file is removed, with the error raised. A file already at
    `path` is replaced, never written through: it may be a hard link that other checkpoints share
    ([`SafetensorsFile.write_to`])."""
    header, offset = {}, 0
    for name, (shape, dtype) in stream.layout.items():
        if dtype not in SAFETENSORS_DTYPES:
            raise TypeError(f"Cannot store {name!r} of dtype {dtype} in safetensors.")
        size = math.prod(shape) * dtype.itemsize
        header[name] = {
            "dtype": SAFETENSORS_DTYPES[dtype],
            "shape": list(shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    Path(path).unlink(missing_ok=True)
    try:
        with open(path, "wb") as file:
            file.write(len(encoded).to_bytes(8, "little"))
            file.write(encoded)
            _write_tensors(file, header, stream, path)
    except BaseException:
        Path(path).unlink(missing_ok=True)  # no file rather than one with holes
        raise


def _write_tensors(file, header: dict, stream: TensorStream, path) -> None:
    data_start, written = file.tell(), set()
    for name, tensor in stream.tensors:
        expected = stream.layout.get(name)
        if expected != (tensor.shape, tensor.dtype):
            found = f"Tensor {name!r} ({tensor.dtype}, shape {tuple(tensor.shape)})"
            wanted = "it is not in it" if expected is None else f"{expected[1]}, shape {tuple(expected[0])}"
            raise ValueError(f"{found} does not match the layout of {path}: {wanted}.")
        if tensor.numel():
            file.seek(data_start + header[name]["data_offsets"][0])  # one that arrives early goes past the end
            file.write(_as_bytes(tensor.detach().to("cpu")))
        written.add(name)
        del tensor  # before the next is produced: one tensor at a time
    missing = [name for name in stream.layout if name not in written]
    if missing:
        raise ValueError(
            f"{path} was written without {missing[:3]} ({len(missing)} tensors of its layout never came)."
        )


def _as_bytes(tensor: torch.Tensor) -> memoryview:
    return memoryview(tensor.contiguous().reshape(-1).view(torch.uint8).numpy())


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
