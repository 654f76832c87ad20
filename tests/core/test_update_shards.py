"""`UpdateShards` on real processes (gloo over 127.0.0.1): the shared update is bitwise the one-process update,
each process draws only its share of the noise, and a checkpoint gets each tensor's optimizer state from its owner."""

from collections import Counter

import pytest
import torch
from scripts.traffic import record_traffic

from benchmarks.harness import run_on_processes
from trl_es.core.direction_optimizer import DirectionOptimizer, DirectionOptimizerSettings
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


def _master(optimizer: str = "adam") -> MasterWeights:
    generator = torch.Generator().manual_seed(0)
    parameters = {name: torch.randn(shape, generator=generator) for name, shape in SHAPES.items()}
    master = MasterWeights(parameters, sigma=0.1)
    master.optimizer = DirectionOptimizer(DirectionOptimizerSettings(optimizer))
    return master


class _CountingMaster(MasterWeights):
    """A master that counts which tensors' directions this process computed (the noise it drew)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.computed = Counter()

    def update_direction(self, name, coefficients):
        self.computed[name] += 1
        return super().update_direction(name, coefficients)


def _worker(rank: int, world: int, lr: float, offload: bool, optimizer: str, results) -> None:
    master = _CountingMaster(dict(_master().tensors), sigma=0.1, offload=offload)
    master.optimizer = DirectionOptimizer(DirectionOptimizerSettings(optimizer), offload=offload)
    shards = UpdateShards(rank, world)
    try:
        norm = master.apply_update(COEFFICIENTS, lr=lr, weight_decay=0.01, shards=shards)
        error = None
    except NonFiniteError as caught:
        norm, error = None, str(caught)
    state = master.optimizer_state(shards) if error is None else {}  # gathered from the owners (collective)
    results[rank] = (dict(master.tensors), norm, dict(master.computed), error, state)


@pytest.mark.parametrize(("world", "offload"), [(2, False), (3, False), (2, True)])
def test_shared_update_is_bitwise_the_single_process_update(world, offload):
    alone = _master()
    expected_norm = alone.apply_update(COEFFICIENTS, lr=1e-2, weight_decay=0.01)

    results = run_on_processes(_worker, world, 1e-2, offload, "adam")

    drawn = Counter()
    for rank in range(world):
        tensors, norm, computed, error, state = results[rank]
        assert error is None
        expected_state = alone.optimizer.state_dict()
        assert state.keys() == expected_state.keys()  # adam's state of every tensor, from its owner
        assert all(torch.equal(state[key], expected_state[key]) for key in expected_state)
        assert norm == expected_norm  # summed in tensor order, not in the order the shards arrived
        for name, tensor in tensors.items():
            assert torch.equal(tensor, alone.tensors[name]), (rank, name)
        assert 0 < sum(computed.values()) <= -(-len(SHAPES) // world)  # its share, not every tensor
        drawn.update(computed)
    assert drawn == Counter(dict.fromkeys(SHAPES, 1))  # every tensor's noise drawn once, over all processes


def test_an_overflowing_shared_step_stops_every_process_with_the_same_error():
    # Finite in float32, but its plain steps overflow every tensor (Adam's would stay about lr in size)
    results = run_on_processes(_worker, 2, 1e38, False, "sgd")

    errors = [results[rank][3] for rank in range(2)]
    assert errors[0] is not None and errors[0] == errors[1]
    assert "would make it non-finite" in errors[0]  # found by the step check, after the shards were exchanged
    for rank in range(2):
        for name, tensor in results[rank][0].items():
            assert torch.isfinite(tensor).all(), (rank, name)


def _optimizer_state_saved(rank: int, world: int, results) -> None:
    master, shards = _master(), UpdateShards(rank, world)
    master.apply_update(COEFFICIENTS, lr=1e-2, weight_decay=0.01, shards=shards)
    traffic = record_traffic()
    state = dict(master.optimizer_stream(shards, keep=rank == 0).tensors)  # what the process that saves writes
    results[rank] = dict(state=state, traffic=traffic, owned=shards.owned(master.shapes, master.updated_names()))


def test_a_checkpoint_gets_each_tensors_optimizer_state_from_its_owner_only_where_it_is_written():
    alone = _master()
    alone.apply_update(COEFFICIENTS, lr=1e-2, weight_decay=0.01)
    expected = alone.optimizer.state_dict()

    results = run_on_processes(_optimizer_state_saved, 2)

    saved = results[0]["state"]
    assert saved.keys() == expected.keys() and all(torch.equal(saved[key], expected[key]) for key in expected)
    assert results[1]["state"] == {}
    # Rank 1 sends adam's two tensors of each tensor it owns to rank 0, point to point; nothing is broadcast (each
    # process received the whole state before 2026-12-06).
    sent = 2 * len(results[1]["owned"])
    assert sent > 0
    assert results[1]["traffic"] == [("send", torch.float32)] * sent
    assert results[0]["traffic"] == [("recv", torch.float32)] * sent
