"""`TensorFiles` and the master shares read through it: what a vLLM server's worker reads at `es_init`. A worker of a
tensor-parallel engine (here: two gloo processes) reads the tensors it owns and only the shapes of the others."""

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from scripts.gloo_processes import run_on_processes

from trl_es.core.sharded_master import EngineShards
from trl_es.core.tensor_files import TensorFiles, read_master_share, read_state_share

SHAPES = {"embed.weight": (32, 8), "layer.0.weight": (8, 8), "layer.0.bias": (8,), "norm.weight": (8,)}
NAMES = ["embed.weight", "layer.0.weight", "norm.weight"]  # evolving; layer.0.bias is frozen


def _checkpoint(folder) -> dict:
    """A model split over two files (bf16, as served), a checkpoint overriding one tensor, and its float32 masters
    and adam state."""
    generator = torch.Generator().manual_seed(0)
    model = {name: torch.randn(shape, generator=generator).bfloat16() for name, shape in SHAPES.items()}
    trained = {"layer.0.weight": model["layer.0.weight"] + 1}
    masters = {name: torch.randn(SHAPES[name], generator=generator) for name in NAMES[:2]}  # norm.weight: none saved
    state = {f"{name}.{part}": torch.rand(SHAPES[name], generator=generator) for name in NAMES for part in ("m", "v")}
    files = {"first": dict(list(model.items())[:2]), "second": dict(list(model.items())[2:]), "trained": trained,
             "masters": masters, "state": state}  # fmt: skip
    for stem, tensors in files.items():
        save_file(tensors, folder / f"{stem}.safetensors")
    return dict(model=model, trained=trained, masters=masters, state=state)


def _files(folder, *stems) -> TensorFiles:
    return TensorFiles([folder / f"{stem}.safetensors" for stem in stems])


def test_tensor_files_know_every_shape_from_the_headers_and_read_named_tensors_with_later_files_winning(tmp_path):
    saved = _checkpoint(tmp_path)
    weights = _files(tmp_path, "first", "second", "trained")

    assert weights.shapes == {name: torch.Size(shape) for name, shape in SHAPES.items()}
    assert "norm.weight" in weights and "lm_head.weight" not in weights
    read = weights.read(["norm.weight", "layer.0.weight"])
    assert list(read) == ["norm.weight", "layer.0.weight"]  # in the order asked
    assert torch.equal(read["norm.weight"], saved["model"]["norm.weight"])
    assert torch.equal(read["layer.0.weight"], saved["trained"]["layer.0.weight"])  # the checkpoint, listed last


def test_an_unsplit_master_reads_every_tensor_rounded_through_the_trainer_dtype_or_the_saved_float32_master(tmp_path):
    saved = _checkpoint(tmp_path)
    weights = _files(tmp_path, "first", "second", "trained")

    fresh = read_master_share(weights, NAMES, torch.float16)
    resumed = read_master_share(weights, NAMES, torch.float16, masters=_files(tmp_path, "masters"))

    assert list(fresh) == NAMES and all(tensor.dtype == torch.float16 for tensor in fresh.values())
    assert torch.equal(fresh["embed.weight"], saved["model"]["embed.weight"].half())
    assert torch.equal(fresh["layer.0.weight"], saved["trained"]["layer.0.weight"].half())
    assert torch.equal(resumed["embed.weight"], saved["masters"]["embed.weight"])  # float32, not rounded
    assert torch.equal(resumed["norm.weight"], fresh["norm.weight"])  # no saved master: the weights'
    state = read_state_share(_files(tmp_path, "state"), resumed)
    assert state.keys() == saved["state"].keys()  # every key, so that restore_optimizer checks them all


def _worker(rank: int, world: int, folder, results) -> None:
    weights = _files(folder, "first", "second", "trained")
    shards = EngineShards(dist.group.WORLD, {name: weights.shapes[name] for name in NAMES})
    share = read_master_share(weights, NAMES, torch.bfloat16, shards, _files(folder, "masters"))
    kept = {
        name: (tensor.device.type, tensor.shape, None if tensor.is_meta else tensor) for name, tensor in share.items()
    }
    owned = {name for name in NAMES if shards.owns(name)}
    results[rank] = dict(owned=owned, share=kept, state=read_state_share(_files(folder, "state"), share))


def test_each_worker_of_a_tensor_parallel_engine_reads_the_tensors_it_owns_and_only_the_shapes_of_the_others(tmp_path):
    saved = _checkpoint(tmp_path)
    alone = read_master_share(_files(tmp_path, "first", "second", "trained"), NAMES, torch.bfloat16,
                              masters=_files(tmp_path, "masters"))  # fmt: skip

    results = run_on_processes(_worker, 2, tmp_path)

    owned = [results[rank]["owned"] for rank in (0, 1)]
    assert owned[0] and owned[1] and owned[0] | owned[1] == set(NAMES) and not owned[0] & owned[1]
    for rank in (0, 1):
        share, state = results[rank]["share"], results[rank]["state"]
        assert list(share) == NAMES  # every name and shape, for the broadcasts from the owners
        for name, (device, shape, tensor) in share.items():
            assert shape == torch.Size(SHAPES[name])
            if name in owned[rank]:
                assert device == "cpu" and torch.equal(tensor, alone[name])
            else:
                assert device == "meta"
        assert {key.rsplit(".", 1)[0] for key in state} == owned[rank]
        assert all(torch.equal(state[key], saved["state"][key]) for key in state)
