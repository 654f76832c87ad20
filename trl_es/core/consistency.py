"""Fingerprints that tell whether two copies of the weights agree.

Two float32 masters that should be identical (trainer and vLLM server, or two ranks) are compared bitwise with a
digest. An inference engine holds the weights in its own layout (fused qkv and gate_up, padded vocabulary, tensor
parallel shards), so it is compared with layout-free statistics: the sum and the sum of squares of all elements,
which concatenation, permutation and zero padding leave unchanged.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable

import torch


def master_digest(tensors: dict[str, torch.Tensor]) -> str:
    """SHA-256 over the names, dtypes, shapes and bytes of `tensors`, in name order."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].detach().to("cpu").contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def layout_free_stats(tensors: Iterable[torch.Tensor], dtype: torch.dtype | None = None) -> tuple[float, float]:
    """`(sum, sum of squares)` of all elements in float64, after casting each tensor to `dtype` if given."""
    total, squares = 0.0, 0.0
    for tensor in tensors:
        values = tensor.detach()
        if dtype is not None:
            values = values.to(dtype)
        values = values.double()
        total += float(values.sum())
        squares += float(values.pow(2).sum())
    return total, squares


def stats_agree(first: tuple[float, float], second: tuple[float, float], rel_tol: float = 1e-9) -> bool:
    """Whether two `layout_free_stats` agree up to float64 summation-order rounding."""
    return all(math.isclose(a, b, rel_tol=rel_tol, abs_tol=1e-9) for a, b in zip(first, second, strict=True))
