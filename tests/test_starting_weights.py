"""es/param_distance's starting weights live in a file, not in memory, and read back bitwise."""

import gc
import os

import pytest
import torch
from safetensors.torch import load_file

from trl_es.core.master import MasterWeights
from trl_es.evaluation.metrics import StartingWeights


def _weights():
    torch.manual_seed(0)
    return {
        "embed.weight": torch.randn(5, 3),
        "norm.weight": torch.randn(3).to(torch.bfloat16),
        "scale": torch.tensor(2.5, dtype=torch.float16),
        "empty": torch.empty(0, 4),
    }


def test_starting_weights_read_back_bitwise_in_their_dtype(tmp_path):
    weights = _weights()
    stored = StartingWeights.write(weights, tmp_path / "start.safetensors")
    assert list(stored) == list(weights)
    for name, tensor in weights.items():
        assert stored[name].dtype == tensor.dtype
        assert torch.equal(stored[name], tensor)


def test_the_file_is_safetensors(tmp_path):
    weights = _weights()
    StartingWeights.write(weights, tmp_path / "start.safetensors")
    loaded = load_file(tmp_path / "start.safetensors")
    assert all(torch.equal(loaded[name], tensor) for name, tensor in weights.items())


def test_relative_distance_from_stored_weights_equals_the_in_memory_one():
    weights = {"w": torch.tensor([3.0, 4.0]), "b": torch.tensor([1.0, -2.0])}
    master = MasterWeights(weights, sigma=0.1)
    master.tensors["w"].add_(1.0)
    stored = StartingWeights.write(weights)
    assert master.relative_distance(stored) == master.relative_distance(weights)


def test_a_temporary_file_is_removed_with_its_object():
    stored = StartingWeights.write({"w": torch.ones(3)})
    path = stored.path
    assert path.is_file()
    del stored
    gc.collect()
    assert not os.path.exists(path)


def test_an_unknown_name_is_a_key_error(tmp_path):
    stored = StartingWeights.write({"w": torch.ones(3)}, tmp_path / "start.safetensors")
    with pytest.raises(KeyError):
        stored["v"]
