"""`TensorFiles` and the shares read through it: what a vLLM server's worker reads at `es_init`, and what a resumed
process reads of a checkpoint's master and `es_optimizer` state. A process that keeps a share (a worker of a
tensor-parallel engine, here one of two gloo processes; a process with `shard_update`) reads that share only. And
`write_safetensors`, which writes a checkpoint's ES state one tensor at a time, as the tensors come, and
`SafetensorsFile.write_to`, which gives every checkpoint of a run the one file of its starting weights."""

import os
import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

from benchmarks.harness import run_on_processes
from trl_es.core.checkpoint import check_saved_tensors
from trl_es.core.direction_optimizer import DirectionOptimizer, DirectionOptimizerSettings
from trl_es.core.guards import NonFiniteError
from trl_es.core.master import MasterWeights
from trl_es.core.sharded_master import ShardedMasterWeights
from trl_es.core.tensor_files import (
    SafetensorsFile,
    TensorFiles,
    TensorStream,
    read_master_share,
    write_safetensors,
)
from trl_es.core.update_shards import EngineShards, UpdateShards

SHAPES = {"embed.weight": (32, 8), "layer.0.weight": (8, 8), "layer.0.bias": (8,), "norm.weight": (8,)}
NAMES = ["embed.weight", "layer.0.weight", "norm.weight"]  # evolving; layer.0.bias is frozen
ADAM = {"es_optimizer": "adam", "es_optimizer_updates": 3}


def _checkpoint(folder) -> dict:
    """A model split over two files (bf16, as served), a checkpoint overriding one tensor, and its float32 masters
    and adam state."""
    generator = torch.Generator().manual_seed(0)
    model = {name: torch.randn(shape, generator=generator).bfloat16() for name, shape in SHAPES.items()}
    trained = {"layer.0.weight": model["layer.0.weight"] + 1}
    masters = {name: torch.randn(SHAPES[name], generator=generator) for name in NAMES[:2]}  # norm.weight: none saved
    state = {
        f"{name}.{part}": torch.rand(SHAPES[name], generator=generator)
        for name in NAMES
        for part in ("exp_avg", "exp_avg_sq")
    }
    files = {"first": dict(list(model.items())[:2]), "second": dict(list(model.items())[2:]), "trained": trained,
             "masters": masters, "state": state}  # fmt: skip
    for stem, tensors in files.items():
        save_file(tensors, folder / f"{stem}.safetensors")
    return dict(model=model, trained=trained, masters=masters, state=state)


class _CountedFiles(TensorFiles):
    """TensorFiles that note every tensor read from them."""

    def __init__(self, files):
        super().__init__(files)
        self.names_read = []

    def __getitem__(self, name):
        self.names_read.append(name)
        return super().__getitem__(name)


def _files(folder, *stems) -> _CountedFiles:
    return _CountedFiles([folder / f"{stem}.safetensors" for stem in stems])


def _adam(master: MasterWeights) -> MasterWeights:
    master.optimizer = DirectionOptimizer(DirectionOptimizerSettings("adam"))
    return master


def test_tensor_files_know_names_shapes_and_dtypes_from_the_headers_and_read_a_tensor_when_asked(tmp_path):
    saved = _checkpoint(tmp_path)
    weights = _files(tmp_path, "first", "second", "trained")

    assert weights.shapes == {name: torch.Size(shape) for name, shape in SHAPES.items()}
    assert set(weights.dtypes.values()) == {torch.bfloat16} and len(weights) == 4
    assert "norm.weight" in weights and "lm_head.weight" not in weights
    check_saved_tensors("first.safetensors", weights, {name: torch.zeros(shape) for name, shape in SHAPES.items()})
    assert weights.names_read == []  # so far only the headers
    read = weights.read(["norm.weight", "layer.0.weight"])
    assert list(read) == ["norm.weight", "layer.0.weight"]  # in the order asked
    assert torch.equal(read["norm.weight"], saved["model"]["norm.weight"])
    assert torch.equal(weights["layer.0.weight"], saved["trained"]["layer.0.weight"])  # the checkpoint, listed last
    with pytest.raises(KeyError, match="lm_head.weight"):
        weights["lm_head.weight"]


def test_a_chosen_part_of_tensor_files_holds_the_names_the_files_hold_and_reads_them_when_asked(tmp_path):
    saved = _checkpoint(tmp_path)
    weights = _files(tmp_path, "first", "second", "trained")

    chosen = weights.only(["layer.0.weight", "norm.weight", "lm_head.weight"])

    assert list(chosen) == ["layer.0.weight", "norm.weight"]  # lm_head.weight is in no file
    assert chosen.shapes == {name: torch.Size(SHAPES[name]) for name in chosen}
    assert weights.names_read == []
    assert torch.equal(chosen["layer.0.weight"], saved["trained"]["layer.0.weight"])  # still the last file's
    with pytest.raises(KeyError):
        chosen["embed.weight"]


def test_a_file_cut_off_inside_a_tensor_is_refused_naming_the_file_and_the_tensor(tmp_path):
    _checkpoint(tmp_path)
    path = tmp_path / "first.safetensors"
    path.write_bytes(path.read_bytes()[:-10])  # the last tensor's last bytes

    files, refused = TensorFiles([path]), {}  # the header is whole
    for name in files:
        try:
            files[name]
        except ValueError as error:
            refused[name] = str(error)
    assert len(refused) == 1  # the tensor stored last; the other reads whole
    ((name, message),) = refused.items()
    assert f"first.safetensors ends inside tensor {name!r}" in message


def test_an_unsplit_master_reads_every_tensor_rounded_through_the_trainer_dtype_or_the_saved_float32_master(tmp_path):
    saved = _checkpoint(tmp_path)
    weights = _files(tmp_path, "first", "second", "trained")

    fresh = read_master_share(weights, NAMES, torch.float16)
    resumed_weights = _files(tmp_path, "first", "second", "trained")
    resumed = read_master_share(resumed_weights, NAMES, torch.float16, masters=_files(tmp_path, "masters"))

    assert list(fresh) == NAMES and all(tensor.dtype == torch.float16 for tensor in fresh.values())
    assert torch.equal(fresh["embed.weight"], saved["model"]["embed.weight"].half())
    assert torch.equal(fresh["layer.0.weight"], saved["trained"]["layer.0.weight"].half())
    assert torch.equal(resumed["embed.weight"], saved["masters"]["embed.weight"])  # float32, not rounded
    assert torch.equal(resumed["norm.weight"], fresh["norm.weight"])  # no saved master: the weights'
    assert resumed_weights.names_read == ["norm.weight"]  # the weights of a saved master are not read


def _sharing_the_update(rank: int, world: int, folder, results) -> None:
    parameters = {name: tensor.float() for name, tensor in _files(folder, "first", "second").read(NAMES).items()}
    shards, state = UpdateShards(rank, world), _files(folder, "state")
    master = _adam(MasterWeights(parameters, sigma=0.1))
    try:
        master.restore_optimizer(state, ADAM, shards)
        error = None
    except NonFiniteError as raised:
        error = str(raised)
    owned = shards.owned({name: tensor.shape for name, tensor in parameters.items()}, NAMES)
    results[rank] = dict(owned=owned, read=state.names_read, state=master.optimizer.state_dict(), error=error)


def test_each_process_sharing_the_update_reads_the_optimizer_state_of_the_tensors_it_owns_only(tmp_path):
    saved = _checkpoint(tmp_path)

    results = run_on_processes(_sharing_the_update, 2, tmp_path)

    for rank in (0, 1):
        owned, read, state = results[rank]["owned"], results[rank]["read"], results[rank]["state"]
        assert {key.rsplit(".", 1)[0] for key in read} == owned != set(NAMES)
        assert state.keys() == set(read) and all(torch.equal(state[key], saved["state"][key]) for key in state)


def _spoil(folder, stem: str, name: str) -> None:
    """Put a NaN into tensor `name` of `<stem>.safetensors`."""
    tensors = load_file(folder / f"{stem}.safetensors")
    tensors[name].view(-1)[0] = float("nan")
    save_file(tensors, folder / f"{stem}.safetensors")


@pytest.mark.parametrize("sharing", ["the update", "an engine"])
def test_a_non_finite_value_in_one_process_s_share_is_raised_by_every_process(tmp_path, sharing):
    saved = _checkpoint(tmp_path)
    shapes = {name: torch.Size(SHAPES[name]) for name in NAMES}
    (spoilt, *_) = sorted(UpdateShards(1, 2).owned(shapes, NAMES))  # EngineShards gives it to rank 1 too
    if sharing == "the update":
        _spoil(tmp_path, "state", f"{spoilt}.exp_avg")
    else:
        _spoil(tmp_path, "masters", spoilt if spoilt in saved["masters"] else "embed.weight")

    results = run_on_processes(_sharing_the_update if sharing == "the update" else _worker, 2, tmp_path)

    errors = [results[rank]["error"] for rank in (0, 1)]
    assert errors[0] is not None and errors[0] == errors[1] and "NaN" in errors[0]  # the owner's, raised by both


def _worker(rank: int, world: int, folder, results) -> None:
    weights = _files(folder, "first", "second", "trained")
    shards = EngineShards(dist.group.WORLD, {name: weights.shapes[name] for name in NAMES})
    masters, state = _files(folder, "masters"), _files(folder, "state")
    share = read_master_share(weights, NAMES, torch.bfloat16, shards)
    master = _adam(ShardedMasterWeights(share, sigma=0.1, shards=shards, device="cpu"))  # as the worker's device
    try:  # as a resumed trainer process: the checkpoint's float32 masters, then its optimizer state
        master.load_saved(masters)
        master.restore_optimizer(state, ADAM)
        error = None
    except NonFiniteError as raised:
        error = str(raised)
    owned = {name for name in NAMES if shards.owns(name)}
    results[rank] = dict(
        owned=owned,
        shapes={name: (tensor.device.type, tensor.shape) for name, tensor in share.items()},
        read=dict(weights=weights.names_read, masters=masters.names_read, state=state.names_read),
        master=dict(master.tensors),
        state=master.optimizer.state_dict(),
        error=error,
    )


def test_each_worker_of_a_tensor_parallel_engine_reads_the_tensors_it_owns_and_only_the_shapes_of_the_others(tmp_path):
    saved = _checkpoint(tmp_path)
    alone = read_master_share(_files(tmp_path, "first", "second", "trained"), NAMES, torch.float32,
                              masters=_files(tmp_path, "masters"))  # fmt: skip

    results = run_on_processes(_worker, 2, tmp_path)

    owned = [results[rank]["owned"] for rank in (0, 1)]
    assert owned[0] and owned[1] and owned[0] | owned[1] == set(NAMES) and not owned[0] & owned[1]
    for rank in (0, 1):
        result, mine = results[rank], owned[rank]
        assert list(result["shapes"]) == NAMES  # every name and shape, for the broadcasts from the owners
        for name, (device, shape) in result["shapes"].items():
            assert shape == torch.Size(SHAPES[name]) and device == ("cpu" if name in mine else "meta")
        assert set(result["read"]["weights"]) == mine
        assert set(result["read"]["masters"]) == mine & set(saved["masters"])
        assert {key.rsplit(".", 1)[0] for key in result["read"]["state"]} == mine
        assert result["master"].keys() == mine
        assert result["error"] is None
        assert all(torch.equal(tensor, alone[name]) for name, tensor in result["master"].items())
        assert all(torch.equal(tensor, saved["state"][key]) for key, tensor in result["state"].items())


def test_a_stream_is_written_one_tensor_at_a_time_in_any_order_as_safetensors_reads_it(tmp_path):
    generator = torch.Generator().manual_seed(0)
    tensors = {"a": torch.randn(3, 4, generator=generator), "b": torch.arange(5).bfloat16(), "c": torch.empty(0, 2)}
    layout = {name: (tensor.shape, tensor.dtype) for name, tensor in tensors.items()}
    arrivals = [("c", tensors["c"]), ("b", tensors["b"]), ("a", tensors["a"])]  # as owners send them, not in order

    write_safetensors(tmp_path / "state.safetensors", TensorStream(layout, iter(arrivals)))

    written = load_file(tmp_path / "state.safetensors")
    assert list(written) == ["a", "b", "c"]  # the layout's order
    assert all(
        torch.equal(written[name], tensor) and written[name].dtype == tensor.dtype for name, tensor in tensors.items()
    )


@pytest.mark.parametrize(
    "arrivals, error",
    [
        (
            [("a", torch.zeros(3, 4)), ("b", torch.zeros(4))],
            r"Tensor 'b' \(torch.float32, shape \(4,\)\) does not match",
        ),
        ([("a", torch.zeros(3, 4)), ("z", torch.zeros(5))], r"Tensor 'z' .* it is not in it"),
        ([("a", torch.zeros(3, 4))], r"written without \['b'\]"),
    ],
    ids=["wrong_shape", "unknown", "missing"],
)
def test_a_stream_that_does_not_match_its_layout_is_an_error_naming_the_tensor_and_leaves_no_file(
    tmp_path, arrivals, error
):
    layout = {"a": (torch.Size([3, 4]), torch.float32), "b": (torch.Size([5]), torch.float32)}
    with pytest.raises(ValueError, match=error):
        write_safetensors(tmp_path / "state.safetensors", TensorStream(layout, iter(arrivals)))
    assert not (tmp_path / "state.safetensors").exists()


def _starting_weights(folder: Path) -> tuple[SafetensorsFile, dict]:
    tensors = {"embed.weight": torch.randn(32, 8).bfloat16(), "norm.weight": torch.ones(8)}
    save_file(tensors, folder / "starting.safetensors")
    return SafetensorsFile(folder / "starting.safetensors"), tensors


def _equal(path: Path, tensors: dict) -> bool:
    written = load_file(path)
    return written.keys() == tensors.keys() and all(torch.equal(written[k], tensors[k]) for k in tensors)


def test_every_checkpoint_of_a_run_links_the_one_file_of_its_starting_weights(tmp_path):
    weights, tensors = _starting_weights(tmp_path)
    copies = [tmp_path / f"checkpoint-{step}" / "reference.safetensors" for step in (1, 2, 3)]
    for copy in copies:
        copy.parent.mkdir()
        weights.write_to(copy)
    inodes = {os.stat(path).st_ino for path in [weights.path, *copies]}
    assert len(inodes) == 1 and os.stat(weights.path).st_nlink == 4  # one file on disk, four names
    assert all(_equal(copy, tensors) for copy in copies)
    assert weights.copies == []  # nothing was written


def test_where_no_link_can_be_made_the_starting_weights_are_written_once_and_later_checkpoints_link_that_copy(
    tmp_path,
):
    """The starting weights of a run live in a temporary file (`TMPDIR`), often on another filesystem than the
    checkpoints: the first checkpoint writes a copy, the next ones link it, and one deleted since is passed over."""
    with tempfile.TemporaryDirectory(dir="/dev/shm") as other_filesystem:  # tmpfs: no hard link to tmp_path
        weights, tensors = _starting_weights(Path(other_filesystem))
        first, second, third = (tmp_path / f"checkpoint-{step}" / "reference.safetensors" for step in (1, 2, 3))
        for copy in (first, second):
            copy.parent.mkdir()
            weights.write_to(copy)
        assert os.stat(first).st_ino != os.stat(weights.path).st_ino  # written: another filesystem
        assert os.stat(second).st_ino == os.stat(first).st_ino and weights.copies == [first]
        for path in (first, second):  # both deleted, as save_total_limit rotates them
            path.unlink()
        third.parent.mkdir()
        weights.write_to(third)
        assert weights.copies == [first, third] and _equal(third, tensors)


def test_writing_over_a_linked_file_replaces_it_and_leaves_the_other_checkpoints_starting_weights_whole(tmp_path):
    weights, tensors = _starting_weights(tmp_path)
    linked = tmp_path / "reference.safetensors"
    weights.write_to(linked)
    other = {"a": torch.zeros(3)}
    write_safetensors(linked, TensorStream.of(other))  # a folder written again: never through the shared file
    assert _equal(linked, other) and _equal(weights.path, tensors)
    weights.write_to(linked)  # and the weights again over it
    assert os.stat(linked).st_ino == os.stat(weights.path).st_ino
