"""Common random numbers for environments: every member of an ES step meets the same episode.

A member's fitness should differ from another's because of its weights, not because its environment drew another
episode. Environments draw their randomness from the global generators (Python's `random`, NumPy's, torch's), so the
trainer seeds all three with the same seed for every member before the same environment call (a reset, a tool call),
and restores them afterwards so that nothing else (sampling, data order) sees a difference.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def seeded_globals(seed: int | None) -> Iterator[None]:
    """Within this context the global generators of `random`, NumPy (if installed) and torch (CPU) start from `seed`;
    their states are restored on exit. `seed=None` leaves them alone."""
    if seed is None:
        yield
        return
    try:
        import numpy
    except ImportError:  # pragma: no cover - numpy comes with torch's usual installs
        numpy = None
    python_state = random.getstate()
    numpy_state = numpy.random.get_state() if numpy is not None else None
    with torch.random.fork_rng(devices=[]):
        random.seed(seed)
        if numpy is not None:
            numpy.random.seed(seed % 2**32)
        torch.manual_seed(seed)
        try:
            yield
        finally:
            random.setstate(python_state)
            if numpy is not None:
                numpy.random.set_state(numpy_state)
