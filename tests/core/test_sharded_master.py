"""`ShardedMasterWeights` on real processes (gloo over 127.0.0.1), as the processes of a tensor-parallel engine use
it: each holds about 1/k of the master, and members, centre, updates and the checkpointed master are bitwise those of
one unsplit master."""

import weakref
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file
from scripts.traffic import record_traffic

from benchmarks.harness import run_on_processes
from trl_es.core.checkpoint import (
    load_es_state,
    load_optimizer_state,
    save_es_state,
    save_es_state_copies,
    save_es_state_shares,
)
from trl_es.core.direction_optimizer import DirectionOptimizer, DirectionOptimizerSettings
from trl_es.core.guards import NonFiniteError
from trl_es.core.master import MasterWeights
from trl_es.core.noise import Member
from trl_es.core.released_weights import release
from trl_es.core.sharded_master import ShardedMasterWeights
from trl_es.core.tensor_files import TensorStream, drain
from trl_es.core.update_shards import EngineShards, UpdateShards

COEFFICIENTS = {11: 0.7, 12: -0.3, 14: 1.25}
SHAPES = {"embed.weight": (64, 16), "layer.0.weight": (16, 16), "layer.0.bias": (16,), "norm.weight": (16,)}
MEMBER = Member(seed=12, sign=-1)


def _parameters() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {name: torch.randn(shape, generator=generator).bfloat16() for name, shape in SHAPES.items()}


def _master(master_class=MasterWeights, offload=False, **kwargs) -> MasterWeights:
    master = master_class(_parameters(), sigma=0.1, offload=offload, **kwargs)
    master.optimizer = DirectionOptimizer(DirectionOptimizerSettings("adam"), offload=offload)
    return master


def _worker(rank: int, world: int, lr: float, offload: bool, results) -> None:
    shards = EngineShards(dist.group.WORLD, {name: torch.Size(shape) for name, shape in SHAPES.items()})
    master = _master(ShardedMasterWeights, offload, shards=shards)
    member = {name: tensor.clone() for name, tensor in master.perturbed(MEMBER)}
    try:
        norm, error = master.apply_update(COEFFICIENTS, lr=lr, weight_decay=0.01), None
        master.apply_update(COEFFICIENTS, lr=lr, weight_decay=0.01)
    except NonFiniteError as caught:
        norm, error = None, str(caught)
    result = dict(owned=dict(master.tensors), member=member, norm=norm, error=error)
    if error is None:
        result["digests"] = master.digests()  # what a vLLM server's workers report to the trainer
        saved = master.full_state_dict(keep=rank == 0)  # what a checkpoint writes, from the owners
        optimizer = master.optimizer_state()
        resumed = _master(ShardedMasterWeights, offload, shards=shards)
        resumed.load_state_dict(master.full_state_dict())
        resumed.restore_optimizer(optimizer, master.optimizer.metadata())
        result |= dict(saved=saved, optimizer=optimizer, resumed=dict(resumed.tensors),
                       resumed_optimizer=resumed.optimizer.state_dict())  # fmt: skip
    results[rank] = result


@pytest.mark.parametrize("offload", [False, True], ids=["on_device", "offloaded"])
def test_a_master_split_over_two_processes_is_bitwise_one_unsplit_master_and_resumes_from_its_checkpoint(offload):
    alone = _master()
    expected_member = dict(alone.perturbed(MEMBER))
    expected_norm = alone.apply_update(COEFFICIENTS, lr=1e-2, weight_decay=0.01)
    alone.apply_update(COEFFICIENTS, lr=1e-2, weight_decay=0.01)

    results = run_on_processes(_worker, 2, 1e-2, offload)

    owned = [set(results[rank]["owned"]) for rank in (0, 1)]
    assert owned[0] | owned[1] == set(SHAPES) and not owned[0] & owned[1]  # each tensor's master on one process
    state = alone.optimizer.state_dict()
    for rank in (0, 1):
        result = results[rank]
        assert result["error"] is None and result["norm"] == expected_norm
        assert result["digests"] == alone.digests()  # the whole master's and its adam state's, from the owners
        assert all(torch.equal(result["member"][n], expected_member[n]) for n in SHAPES)  # from the owners
        assert all(torch.equal(t, alone.tensors[n]) for n, t in result["owned"].items())
        assert result["optimizer"].keys() == state.keys()  # the adam state of every tensor, from its owner
        assert all(torch.equal(result["optimizer"][key], state[key]) for key in state)
        assert all(torch.equal(t, alone.tensors[n]) for n, t in result["resumed"].items())
        resumed_state = result["resumed_optimizer"]
        assert {key.rsplit(".", 1)[0] for key in resumed_state} == owned[rank]  # each keeps its own tensors' state
        assert all(torch.equal(resumed_state[key], state[key]) for key in resumed_state)
    saved = results[0]["saved"]
    assert saved.keys() == alone.tensors.keys() and all(torch.equal(saved[n], alone.tensors[n]) for n in SHAPES)
    assert results[1]["saved"] == {}  # a process that saves nothing keeps nothing


def test_a_non_finite_step_found_by_one_owner_stops_every_process():
    results = run_on_processes(_worker, 2, 1e38, False)  # finite in float32, but its steps overflow

    errors = [results[rank]["error"] for rank in (0, 1)]
    assert errors[0] is not None and errors[0] == errors[1] and "non-finite" in errors[0]
    for rank in (0, 1):
        assert all(torch.isfinite(tensor).all() for tensor in results[rank]["owned"].values())


def _written_in_bfloat16(rank: int, world: int, results) -> None:
    shards = EngineShards(dist.group.WORLD, {name: torch.Size(shape) for name, shape in SHAPES.items()})
    master = _master(ShardedMasterWeights, shards=shards)
    traffic = record_traffic()
    member = dict(master.perturbed(MEMBER, dtype=torch.bfloat16))
    centre = dict(master.centre(dtype=torch.bfloat16))
    results[rank] = dict(member=member, centre=centre, owned=set(master.tensors), traffic=traffic)


def test_a_split_master_sends_each_tensor_in_the_engines_dtype_with_the_bits_of_its_float32_value_cast():
    alone = _master()
    member = {name: value.bfloat16() for name, value in alone.perturbed(MEMBER)}
    centre = {name: value.bfloat16() for name, value in alone.centre()}
    assert all(torch.equal(value, member[name]) for name, value in alone.perturbed(MEMBER, dtype=torch.bfloat16))

    results = run_on_processes(_written_in_bfloat16, 2)

    for rank in (0, 1):
        assert results[rank]["owned"] != set(SHAPES)  # the others' tensors came from their owners...
        assert results[rank]["traffic"] == [("broadcast", torch.bfloat16)] * 2 * len(SHAPES)  # ...in bf16: half
        for name in SHAPES:
            assert results[rank]["member"][name].dtype == torch.bfloat16
            assert torch.equal(results[rank]["member"][name], member[name])
            assert torch.equal(results[rank]["centre"][name], centre[name])


def _centre_written(rank: int, world: int, offload: bool, results) -> None:
    shards = EngineShards(dist.group.WORLD, {name: torch.Size(shape) for name, shape in SHAPES.items()})
    parameters = _parameters()
    master = ShardedMasterWeights(parameters, sigma=0.1, shards=shards, offload=offload)
    if rank == 1:
        release(parameters)  # a process that saves no checkpoint keeps no model
    master.apply_update(COEFFICIENTS, lr=1e-2, weight_decay=0.01)
    traffic = record_traffic()
    master.write_centre_into(parameters)
    results[rank] = dict(parameters=parameters, traffic=traffic, owned=set(master.tensors))


@pytest.mark.parametrize("offload", [False, True], ids=["on_device", "offloaded"])
def test_the_new_centre_travels_from_each_owner_to_the_process_that_keeps_the_model_only(offload):
    alone = MasterWeights(_parameters(), sigma=0.1)
    alone.apply_update(COEFFICIENTS, lr=1e-2, weight_decay=0.01)

    results = run_on_processes(_centre_written, 2, offload)

    kept, released = results[0], results[1]
    assert all(torch.equal(kept["parameters"][name], alone.tensors[name].bfloat16()) for name in SHAPES)
    assert all(parameter.numel() == 0 for parameter in released["parameters"].values())  # still released
    assert 0 < len(released["owned"]) < len(SHAPES)
    # Rank 1 sends its own tensors, in the model's bf16, and receives nothing; rank 0 receives those only.
    assert released["traffic"] == [("send", torch.bfloat16)] * len(released["owned"])
    assert kept["traffic"] == [("recv", torch.bfloat16)] * len(released["owned"])


def _checkpoint_written(rank: int, world: int, folder, results) -> None:
    shards = EngineShards(dist.group.WORLD, {name: torch.Size(shape) for name, shape in SHAPES.items()})
    master = _master(ShardedMasterWeights, shards=shards)
    master.apply_update(COEFFICIENTS, lr=1e-2, weight_decay=0.01)  # the adam state exists from the first update
    saves, alive = rank == 0, []
    traffic = record_traffic()
    masters = _counting_alive(master.checkpoint_stream(SHAPES, keep=saves), set(master.tensors), alive)
    optimizer_state = _counting_alive(master.optimizer_stream(keep=saves), set(master.tensors), alive)
    if saves:
        save_es_state(folder, masters, dict(_parameters()), {"global_step": 1}, optimizer_state)
    else:
        drain(masters)
        drain(optimizer_state)
    results[rank] = dict(traffic=traffic, owned=set(master.tensors), alive=alive)


def _counting_alive(stream: TensorStream, owned: set[str], alive: list[int]) -> TensorStream:
    """`stream`, recording as each tensor arrives how many received before it are still held anywhere (the tensors
    this process owns are its master's own)."""
    received = []

    def tensors():
        for key, tensor in stream.tensors:
            alive.append(sum(ref() is not None for ref in received))
            name = key if key in SHAPES else key.rsplit(".", 1)[0]  # an adam state key: "<name>.<suffix>"
            if name not in owned:
                received.append(weakref.ref(tensor))
            yield key, tensor
            del tensor

    return TensorStream(stream.layout, tensors())


def test_a_checkpoint_of_a_split_master_gets_each_tensor_from_its_owner_one_at_a_time_and_only_where_it_is_written(
    tmp_path,
):
    alone = _master()
    alone.apply_update(COEFFICIENTS, lr=1e-2, weight_decay=0.01)

    results = run_on_processes(_checkpoint_written, 2, tmp_path)

    masters, _, _ = load_es_state(tmp_path)
    assert all(torch.equal(masters[name], alone.tensors[name]) for name in SHAPES) and len(masters) == len(SHAPES)
    optimizer_state, expected = load_optimizer_state(tmp_path), alone.optimizer.state_dict()
    assert optimizer_state.keys() == expected.keys()
    assert all(torch.equal(optimizer_state[key], expected[key]) for key in expected)
    # Rank 1 sends its master and adam state (m, v) to rank 0, point to point, in float32; nothing is broadcast.
    sent = 3 * len(results[1]["owned"])
    assert results[1]["traffic"] == [("send", torch.float32)] * sent
    assert results[0]["traffic"] == [("recv", torch.float32)] * sent
    # Rank 0 held one received tensor at a time: each was written and let go of before the next came (where the
    # stream was gathered whole, all of them were alive at the end).
    assert len(results[0]["alive"]) == 3 * len(SHAPES) and set(results[0]["alive"]) == {0}


def _shares_written(rank: int, world: int, folder, non_finite_on: int | None, results) -> None:
    # Engine groups of two processes (one group where world is 2), each holding the whole master split between them
    groups = [dist.new_group([first, first + 1]) for first in range(0, world, 2)]
    shards = EngineShards(groups[rank // 2], {name: torch.Size(shape) for name, shape in SHAPES.items()})
    master = _master(ShardedMasterWeights, shards=shards)
    master.apply_update(COEFFICIENTS, lr=1e-2, weight_decay=0.01)
    if rank == non_finite_on:
        next(iter(master.tensors.values()))[0] = float("nan")  # as no update can leave it: the save's own check
    saves = rank == 0
    traffic = record_traffic()
    masters = master.checkpoint_stream(SHAPES, keep=saves, own=True)
    optimizer_state = master.optimizer_stream(keep=saves, own=True)
    saver = dict(reference=dict(_parameters()), metadata={"global_step": 1}) if saves else {}
    try:
        save_es_state_shares(folder, rank, masters, optimizer_state, UpdateShards(rank, world).all_gather, **saver)
        error = None
    except (NonFiniteError, RuntimeError) as raised:
        error = f"{type(raised).__name__}: {raised}"
    results[rank] = dict(traffic=traffic, owned=set(master.tensors), error=error)


def test_each_owner_of_a_split_master_writes_its_own_share_of_a_checkpoint_and_nothing_travels(tmp_path):
    alone = _master()
    alone.apply_update(COEFFICIENTS, lr=1e-2, weight_decay=0.01)

    results = run_on_processes(_shares_written, 2, tmp_path, None)

    assert all(result["error"] is None and result["traffic"] == [] for result in results.values())
    masters, _, metadata = load_es_state(tmp_path)
    assert metadata["master_files"] == ["master.safetensors", "master-rank-1.safetensors"]
    assert all(torch.equal(masters[name], alone.tensors[name]) for name in SHAPES) and len(masters) == len(SHAPES)
    optimizer_state, expected = load_optimizer_state(tmp_path), alone.optimizer.state_dict()
    assert optimizer_state.keys() == expected.keys()
    assert all(torch.equal(optimizer_state[key], expected[key]) for key in expected)
    for rank, file in enumerate(metadata["master_files"]):  # each file holds its writer's tensors, no other
        assert set(load_file(tmp_path / "es_state" / file)) == results[rank]["owned"]


@pytest.mark.parametrize("non_finite_on", [0, 1])
def test_a_non_finite_share_stops_every_process_and_leaves_no_es_state(tmp_path, non_finite_on):
    results = run_on_processes(_shares_written, 2, tmp_path, non_finite_on)

    assert "NaN or infinite" in results[non_finite_on]["error"]
    other = results[1 - non_finite_on]["error"]
    assert other.startswith(f"NonFiniteError: Process {non_finite_on} could not write its share of the ES state")
    assert not (tmp_path / "es_state").exists()


def _copies_written(rank: int, world: int, folder, failing: int | None, results) -> None:
    # A short timeout: a process left waiting for a peer that stopped sending fails the test instead of holding it
    group = dist.new_group(list(range(world)), timeout=timedelta(seconds=30))
    master = _master(ShardedMasterWeights, shards=EngineShards(group, {n: torch.Size(s) for n, s in SHAPES.items()}))
    master.apply_update(COEFFICIENTS, lr=1e-2, weight_decay=0.01)
    disk = folder / f"machine{rank}"  # every process saves, each to its own disk (`save_on_each_node`)
    disk.mkdir()
    if rank == failing:
        (disk / "es_state").write_text("")  # a file where the ES state's folder goes: nothing can be written there
    masters, optimizer_state = master.checkpoint_stream(SHAPES), master.optimizer_stream()
    try:
        save_es_state_copies(disk, masters, optimizer_state, UpdateShards(rank, world).all_gather,
                             reference=dict(_parameters()), metadata={"global_step": 1})  # fmt: skip
        error = None
    except Exception as raised:
        error = f"{type(raised).__name__}: {raised}"
    results[rank] = dict(error=error)


def test_with_a_saver_on_each_machine_each_writes_the_whole_split_master(tmp_path):
    alone = _master()
    alone.apply_update(COEFFICIENTS, lr=1e-2, weight_decay=0.01)

    results = run_on_processes(_copies_written, 2, tmp_path, None)

    assert [result["error"] for result in results.values()] == [None, None]
    for rank in (0, 1):
        masters, _, metadata = load_es_state(tmp_path / f"machine{rank}")
        assert metadata["master_files"] == ["master.safetensors"]
        assert all(torch.equal(masters[name], alone.tensors[name]) for name in SHAPES) and len(masters) == len(SHAPES)


@pytest.mark.parametrize("failing", [0, 1])
def test_a_saver_that_cannot_write_stops_every_saver_naming_it_and_leaves_no_es_state(tmp_path, failing):
    results = run_on_processes(_copies_written, 2, tmp_path, failing)

    assert results[failing]["error"].startswith("FileExistsError")
    other = results[1 - failing]["error"]  # not a peer that went away mid-send: it names the process and the problem
    assert other.startswith(f"RuntimeError: Process {failing} could not write the ES state to "), other
    assert "FileExistsError" in other
    assert not (tmp_path / f"machine{1 - failing}" / "es_state").exists()


def test_with_several_engine_groups_only_the_group_of_the_process_that_saves_writes_the_master(tmp_path):
    alone = _master()
    alone.apply_update(COEFFICIENTS, lr=1e-2, weight_decay=0.01)

    run_on_processes(_shares_written, 4, tmp_path, None)

    masters, _, metadata = load_es_state(tmp_path)
    assert metadata["master_files"] == ["master.safetensors", "master-rank-1.safetensors"]
    assert metadata["optimizer_files"] == ["optimizer.safetensors", "optimizer-rank-1.safetensors"]
    assert all(torch.equal(masters[name], alone.tensors[name]) for name in SHAPES) and len(masters) == len(SHAPES)
    written = sorted(path.name for path in (tmp_path / "es_state").iterdir())  # nothing from processes 2 and 3
    assert written == ["es_state.json", "master-rank-1.safetensors", "master.safetensors",
                       "optimizer-rank-1.safetensors", "optimizer.safetensors", "reference.safetensors"]  # fmt: skip
