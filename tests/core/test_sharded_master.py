"""`ShardedMasterWeights` on real processes (gloo over 127.0.0.1), as the processes of a tensor-parallel engine use
it: each holds about 1/k of the master, and members, centre, updates and the checkpointed master are bitwise those of
one unsplit master."""

import torch
import torch.distributed as dist
from scripts.gloo_processes import run_on_processes

from trl_es.core.guards import NonFiniteError
from trl_es.core.master import MasterWeights
from trl_es.core.noise import Member
from trl_es.core.sharded_master import EngineShards, ShardedMasterWeights

COEFFICIENTS = {11: 0.7, 12: -0.3, 14: 1.25}
SHAPES = {"embed.weight": (64, 16), "layer.0.weight": (16, 16), "layer.0.bias": (16,), "norm.weight": (16,)}
MEMBER = Member(seed=12, sign=-1)


def _parameters() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {name: torch.randn(shape, generator=generator).bfloat16() for name, shape in SHAPES.items()}


def _worker(rank: int, world: int, lr: float, results) -> None:
    parameters = _parameters()
    shards = EngineShards(dist.group.WORLD, {name: p.shape for name, p in parameters.items()})
    master = ShardedMasterWeights(parameters, sigma=0.1, shards=shards)
    member = {name: tensor.clone() for name, tensor in master.perturbed(MEMBER)}
    try:
        norm, error = master.apply_update(COEFFICIENTS, lr=lr, weight_decay=0.01), None
    except NonFiniteError as caught:
        norm, error = None, str(caught)
    whole = master.full_state_dict(keep=rank == 0)
    results[rank] = dict(owned=dict(master.tensors), member=member, norm=norm, error=error, whole=whole)


def test_a_master_split_over_two_processes_is_bitwise_one_unsplit_master():
    alone = MasterWeights(_parameters(), sigma=0.1)
    expected_member = dict(alone.perturbed(MEMBER))
    expected_norm = alone.apply_update(COEFFICIENTS, lr=1e-2, weight_decay=0.01)

    results = run_on_processes(_worker, 2, 1e-2)

    owned = [set(results[rank]["owned"]) for rank in (0, 1)]
    assert owned[0] | owned[1] == set(SHAPES) and not owned[0] & owned[1]  # each tensor's master on one process
    for rank in (0, 1):
        assert results[rank]["error"] is None and results[rank]["norm"] == expected_norm
        assert all(torch.equal(results[rank]["member"][n], expected_member[n]) for n in SHAPES)  # from the owners
        assert all(torch.equal(t, alone.tensors[n]) for n, t in results[rank]["owned"].items())
    whole = results[0]["whole"]
    assert whole.keys() == alone.tensors.keys() and all(torch.equal(whole[n], alone.tensors[n]) for n in SHAPES)
    assert results[1]["whole"] == {}  # a process that saves nothing keeps nothing


def test_a_non_finite_step_found_by_one_owner_stops_every_process():
    results = run_on_processes(_worker, 2, 1e38)  # finite in float32, but its steps overflow

    errors = [results[rank]["error"] for rank in (0, 1)]
    assert errors[0] is not None and errors[0] == errors[1] and "non-finite" in errors[0]
    for rank in (0, 1):
        assert all(torch.isfinite(tensor).all() for tensor in results[rank]["owned"].values())
