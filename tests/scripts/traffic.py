"""What a process sends and receives through `torch.distributed`, recorded by the tests of who sends what where."""

import torch
import torch.distributed as dist


def record_traffic() -> list[tuple[str, torch.dtype]]:
    """From now on, each broadcast, send and receive of this process (the real ones), and the dtype it carried."""
    traffic = []
    for kind in ("broadcast", "send", "recv"):
        real = getattr(dist, kind)

        def recorded(tensor, *args, real=real, kind=kind, **kwargs):
            traffic.append((kind, tensor.dtype))
            return real(tensor, *args, **kwargs)

        setattr(dist, kind, recorded)
    return traffic
