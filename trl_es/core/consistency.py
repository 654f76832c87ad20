"""Fingerprints that tell whether two copies of the weights agree.

Two float32 masters that should be identical (trainer and vLLM server, or two ranks) are compared bitwise with a
digest. An inference engine holds the weights in its own layout (fused qkv and gate_up, padded vocabulary, tensor
parallel shards), so it is compared with layout-free statistics: the sum and the sum of squares of all elements,
which concatenation, permutation and zero padding leave unchanged. Whether an engine's weights changed between two
moments (behind the trainer's back) is told by a per-tensor fingerprint of the engine's own tensors.
"""

from __future__ import annotations

import hashlib
import math
import zlib
from collections.abc import Iterable

import torch

from .tensor_chunks import sum_and_squares


def tensor_digests(tensors: dict[str, torch.Tensor]) -> dict[str, str]:
    """Per tensor, the SHA-256 of its name, dtype, shape and bytes."""
    digests = {}
    for name, value in tensors.items():
        tensor = value.detach().to("cpu").contiguous()
        digest = hashlib.sha256(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.view(torch.uint8).numpy().data)
        digests[name] = digest.hexdigest()
    return digests


def combined_digest(digests: dict[str, str]) -> str:
    """SHA-256 over per-tensor digests (`tensor_digests`) in name order: the digest of the tensors they came from,
    whichever processes computed them (a master split between processes gathers its owners')."""
    return hashlib.sha256("".join(f"{name}:{digests[name]}\n" for name in sorted(digests)).encode()).hexdigest()


def master_digest(tensors: dict[str, torch.Tensor]) -> str:
    """A digest of `tensors`: names, dtypes, shapes and bytes (`combined_digest` of their `tensor_digests`)."""
    return combined_digest(tensor_digests(tensors))


def optimizer_state_digests(optimizer) -> dict[str, str]:
    """The `tensor_digests` of an `es_optimizer`'s state tensors."""
    return tensor_digests({f"state/{key}": tensor for key, tensor in optimizer.state_dict().items()})


def optimizer_digest(optimizer, state_digests: dict[str, str] | None = None) -> str:
    """A digest of an `es_optimizer`'s settings, number of updates and state tensors; `state_digests`: the whole
    state's `optimizer_state_digests`, where the optimizer holds part of it (gathered from the owners)."""
    state_digests = optimizer_state_digests(optimizer) if state_digests is None else state_digests
    return f"{optimizer.settings}|{optimizer.updates}|{combined_digest(state_digests)}"


def layout_free_stats(tensors: Iterable[torch.Tensor], dtype: torch.dtype | None = None) -> tuple[float, float]:
    """`(sum, sum of squares)` of all elements in float64, after casting each tensor to `dtype` if given."""
    total, squares = 0.0, 0.0
    for tensor in tensors:
        tensor_sum, tensor_squares = sum_and_squares(tensor, dtype).tolist()
        total += tensor_sum
        squares += tensor_squares
    return total, squares


def stats_agree(first: tuple[float, float], second: tuple[float, float], rel_tol: float = 1e-9) -> bool:
    """Whether two `layout_free_stats` agree up to float64 summation-order rounding."""
    return all(math.isclose(a, b, rel_tol=rel_tol, abs_tol=1e-9) for a, b in zip(first, second, strict=True))


def engine_fingerprint(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> dict[str, object]:
    """Per tensor, a value that changes when the tensor does: the CRC-32 of its bytes where it lives on the CPU
    (several times cheaper than a cryptographic hash; certain to catch any change within 32 consecutive bits, any
    other with probability 1 - 2^-32); on an accelerator, where copying it to the host would cost more than the check
    is worth, its float64 sum and sum of squares, computed in place. Not a MAC: it catches changes made inside the
    engine, not forgeries (the control channel's secret keeps forgers out)."""
    fingerprint, on_device = {}, {}
    for name, tensor in named_tensors:
        values = tensor.detach()
        if values.device.type == "cpu":
            fingerprint[name] = zlib.crc32(values.reshape(-1).contiguous().view(torch.uint8).numpy().data)
        else:
            on_device[name] = sum_and_squares(values)
    if on_device:
        sums = torch.stack(list(on_device.values())).cpu().tolist()
        fingerprint.update(zip(on_device, sums, strict=True))
    return fingerprint
