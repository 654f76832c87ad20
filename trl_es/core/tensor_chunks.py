"""Elementwise work over a large tensor in slices, so that its temporaries stay small.

The master is computed one tensor at a time, and the largest tensor sets the peak: an embedding of 152k x 3.6k (a 7B
model's) is 545M elements, and every float32 temporary of it 2.2 GB on the accelerator. Noise must be drawn whole (it
is a function of the tensor's full shape), but what follows it is elementwise (a sum, a cast, a split into bfloat16
halves) and is done here a slice at a time: the values are the same bits as over the whole tensor, the temporaries
those of one slice. Reductions copy a slice at most (a sum of squares in float64), or nothing (a largest magnitude).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

# Elements per slice: 4 MiB of float32, large enough that a kernel per slice costs little beside its work.
SLICE_ELEMENTS = 1 << 20


def flat_slices(*tensors: torch.Tensor) -> Iterator[tuple[torch.Tensor, ...]]:
    """Matching slices of `tensors` (of one shape), at most `SLICE_ELEMENTS` elements each, in order: views that
    write through. Where one is not contiguous it has no flat view, and the tensors come whole, once."""
    if not all(tensor.is_contiguous() for tensor in tensors):
        yield tensors
        return
    flat = [tensor.view(-1) for tensor in tensors]
    numel = flat[0].numel()
    for start in range(0, numel, SLICE_ELEMENTS):
        yield tuple(values[start : start + SLICE_ELEMENTS] for values in flat)


def sum_and_squares(tensor: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """`[sum, sum of squares]` of `tensor`'s elements (each cast to `dtype` first, where given), accumulated in float64
    a slice at a time, as a tensor on `tensor`'s device (a float64 copy of the whole tensor would take twice its
    float32 bytes, and its square as much again)."""
    totals = torch.zeros(2, dtype=torch.float64, device=tensor.device)
    for (values,) in flat_slices(tensor.detach()):
        values = (values if dtype is None else values.to(dtype)).double()
        totals[0] += values.sum()
        totals[1] += values.square().sum()
    return totals


def squared_norm(tensor: torch.Tensor) -> float:
    """The sum of squares of `tensor`, in float64 (`sum_and_squares`)."""
    return float(sum_and_squares(tensor)[1])


def squared_distance(tensor: torch.Tensor, other: torch.Tensor) -> float:
    """The sum of `(tensor - other) ** 2` in float64, each cast to float32 first, a slice at a time: neither the cast
    nor the difference is made of the whole tensor."""
    total = torch.zeros((), dtype=torch.float64, device=tensor.device)
    for part, other_part in flat_slices(tensor.detach(), other.detach()):
        total += (part.float() - other_part.float()).double().square().sum()
    return float(total)


def largest_magnitude(tensor: torch.Tensor) -> float:
    """`max |tensor|` without a copy of it (0 for an empty tensor); NaN where the tensor holds a NaN."""
    if tensor.numel() == 0:
        return 0.0
    smallest, largest = torch.aminmax(tensor.detach())  # a model's parameter: no graph, and no warning
    return float(torch.maximum(largest, -smallest))
