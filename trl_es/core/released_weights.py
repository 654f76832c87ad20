"""Model weights a process lets go of, and gets back from another process when it needs them (issue 29).

The processes that save no checkpoint, where vLLM engines evaluate the members, need none of the trainer's model:
the engines get every member from the master (`trainer/released_model.py`). Holding the model there would cost one
copy per process (1.1 TB on a node of 8 for a bf16 70B). A released parameter keeps its `Parameter` object (an
optimizer, a tied weight and the population hold that), its dtype and device, but its data is an empty tensor, as
DeepSpeed ZeRO-3 leaves the parameters a process does not hold: anything that computes with it fails on its shape
instead of reading stale values. Its shape is kept on the parameter, where [`restore`] finds it.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from .update_shards import all_gather_objects

RELEASED_SHAPE = "es_released_shape"  # the attribute a released parameter keeps its shape in


def is_released(parameter: torch.Tensor) -> bool:
    return hasattr(parameter, RELEASED_SHAPE)


def full_shape(parameter: torch.Tensor) -> torch.Size:
    """The shape of `parameter`'s data, held or released."""
    return getattr(parameter, RELEASED_SHAPE, parameter.shape)


def release(parameters: Mapping[str, torch.nn.Parameter]) -> None:
    """Let go of the data of `parameters` (each keeps its object, dtype and device, and its shape for [`restore`])."""
    for parameter in parameters.values():
        if not is_released(parameter):
            setattr(parameter, RELEASED_SHAPE, parameter.shape)
            parameter.data = torch.empty(0, dtype=parameter.dtype, device=parameter.device)


def released_bytes(parameters: Mapping[str, torch.nn.Parameter]) -> int:
    """The bytes `parameters` would hold if none were released (what [`release`] gave back)."""
    return sum(getattr(p, RELEASED_SHAPE).numel() * p.element_size() for p in parameters.values() if is_released(p))


def restore(
    parameters: Mapping[str, torch.nn.Parameter], source: int, device: torch.device, wanted: bool = True
) -> None:
    """Give back their data to the released `parameters` of every process, from process `source`, which holds every
    one of them. Collective over the default group: every process calls it with the same names in the same order;
    nothing is sent when no process released any (or none that did wants them: `wanted=False`, for one that reads
    its values elsewhere; it still receives them if another process asks), and a `source` that released some is an
    error on every process. Each tensor travels on `device` (the accelerator where the group communicates through
    NCCL), one at a time, as bytes, so the group's backend need not know its dtype."""
    released = [name for name, parameter in parameters.items() if wanted and is_released(parameter)]
    by_process = all_gather_objects(released[:3], torch.distributed.get_world_size())  # a few names each
    if not any(by_process):
        return
    if by_process[source]:
        raise RuntimeError(
            f"Process {source} was to send the model's weights to the processes that released them, but it released "
            f"{by_process[source]} too. Only a process that saves checkpoints can give them back."
        )
    for parameter in parameters.values():
        if torch.distributed.get_rank() == source:
            value = parameter.detach().to(device).contiguous()
        else:
            value = torch.empty(full_shape(parameter), dtype=parameter.dtype, device=device)
        torch.distributed.broadcast(value.view(-1).view(torch.uint8), src=source)
        if is_released(parameter):  # the others hold it already (their copy is the source's)
            parameter.data = value.to(parameter.device)
            delattr(parameter, RELEASED_SHAPE)
