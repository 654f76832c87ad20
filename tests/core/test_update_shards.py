"""`UpdateShards` on real processes (gloo over 127.0.0.1): the shared update is bitwise the one-process update,
and each process draws only its share of the noise."""

from collections import Counter

import pytest
import torch
from scripts.gloo_processes import run_on_processes

from trl_es.core.guards import NonFiniteError
from trl_es.core.master import MasterWeights
from trl_es.core.update_shards import UpdateShards

COEFFICIENTS = {11: 0.7, 12: -0.3, 13: 0.0, 14: 1.25}
SHAPES = {
    "embed.weight": (64, 16),
    "layer.0.weight": (16, 16),
    "layer.0.bias": (16,),
    "norm.weight": (16,),
    "head": (7, 16),
}


def _master() -> MasterWeights:
    generator = torch.Generator().manual_seed(0)
    return MasterWeights({name: torch.randn(shape, generator=generator) for name, shape in SHAPES.items()}, sigma=0.1)


class _CountingMaster(MasterWeights):
    """A master that counts which tensors' directions this process computed (the noise it drew)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.computed = Counter()

    def update_direction(self, name, coefficients):
        self.computed[name] += 1
        return super().update_direction(name, coefficients)


def _worker(rank: int, world: int, lr: float, results) -> None:
    master = _CountingMaster(_master().tensors, sigma=0.1)
    try:
        norm = master.apply_update(COEFFICIENTS, lr=lr, weight_decay=0.01, shards=UpdateShards(rank, world))
        error = None
    except NonFiniteError as caught:
        norm, error = None, str(caught)
    results[rank] = (master.tensors, norm, dict(master.computed), error)


@pytest.mark.parametrize("world", [2, 3])
def test_shared_update_is_bitwise_the_single_process_update(world):
    alone = _master()
    expected_norm = alone.apply_update(COEFFICIENTS, lr=1e-2, weight_decay=0.01)

    results = run_on_processes(_worker, world, 1e-2)

    drawn = Counter()
    for rank in range(world):
        tensors, norm, computed, error = results[rank]
        assert error is None
        assert norm == expected_norm  # summed in tensor order, not in the order the shards arrived
        for name, tensor in tensors.items():
            assert torch.equal(tensor, alone.tensors[name]), (rank, name)
        assert 0 < sum(computed.values()) <= -(-len(SHAPES) // world)  # its share, not every tensor
        drawn.update(computed)
    assert drawn == Counter(dict.fromkeys(SHAPES, 1))  # every tensor's noise drawn once, over all processes


def test_an_overflowing_shared_step_stops_every_process_with_the_same_error():
    results = run_on_processes(_worker, 2, 1e38)  # finite in float32, but its steps overflow every tensor

    errors = [results[rank][3] for rank in range(2)]
    assert errors[0] is not None and errors[0] == errors[1]
    assert "would make it non-finite" in errors[0]  # found by the step check, after the shards were exchanged
    for rank in range(2):
        for name, tensor in results[rank][0].items():
            assert torch.isfinite(tensor).all(), (rank, name)
