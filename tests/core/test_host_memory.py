"""`offload_master`: the float32 master and the optimizer state kept in host memory, computed on the parameters'
device one tensor at a time. On this CPU machine host and device are one, but every read is still a copy that must
be stored back, as on an accelerator: an offloaded master that forgot to store a change would differ here too."""

import pytest
import torch

from trl_es.core.direction_optimizer import DirectionOptimizer, DirectionOptimizerSettings
from trl_es.core.guards import NonFiniteError
from trl_es.core.host_memory import HostTensors
from trl_es.core.master import MasterWeights
from trl_es.core.noise import Member

COEFFICIENTS = [{1: 0.5, 2: -0.25, 3: 0.125}, {4: -1.0, 5: 0.75}, {6: 0.3}]


def _parameters() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {
        "embed.weight": torch.randn(16, 8, generator=generator).bfloat16(),
        "layer.weight": torch.randn(8, 8, generator=generator),  # float32: shared with its master when on the device
        "layer.bias": torch.randn(8, generator=generator).bfloat16(),
    }


def _master(offload: bool, optimizer: str = "adam", parameters=None) -> MasterWeights:
    parameters = _parameters() if parameters is None else parameters
    master = MasterWeights(parameters, sigma=0.1, share_float32=not offload, offload=offload)
    master.optimizer = DirectionOptimizer(DirectionOptimizerSettings(optimizer), offload=offload)
    return master


def _assert_same_tensors(actual: dict, expected: dict) -> None:
    assert actual.keys() == expected.keys()
    for name in expected:
        assert torch.equal(actual[name], expected[name]), name


def test_a_read_is_a_copy_that_lasts_only_once_stored():
    tensors = HostTensors({"w": torch.zeros(3)}, torch.device("cpu"))
    value = tensors["w"]
    value.add_(1.0)
    assert torch.equal(tensors["w"], torch.zeros(3))  # the host tensor did not change with its copy
    tensors.store("w", value)
    assert torch.equal(tensors["w"], torch.ones(3)) and tensors.host["w"] is not value


@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam"])
def test_an_offloaded_master_trains_bitwise_like_a_master_on_the_device(optimizer):
    parameters = _parameters()
    offloaded, on_device = _master(True, optimizer, parameters), _master(False, optimizer)

    stored = offloaded.state_dict()
    assert all(stored[name].data_ptr() != parameters[name].data_ptr() for name in parameters)  # own host copies
    assert offloaded.nbytes() == 4 * sum(parameter.numel() for parameter in parameters.values())
    for coefficients in COEFFICIENTS:
        _assert_same_tensors(dict(offloaded.perturbed(Member(7, -1))), dict(on_device.perturbed(Member(7, -1))))
        norm = offloaded.apply_update(coefficients, lr=1e-2, weight_decay=0.1)
        assert norm == on_device.apply_update(coefficients, lr=1e-2, weight_decay=0.1)
    _assert_same_tensors(offloaded.state_dict(), dict(on_device.centre()))
    _assert_same_tensors(offloaded.optimizer.state_dict(), on_device.optimizer.state_dict())
    assert offloaded.state_dict() is stored and torch.equal(parameters["layer.weight"], _parameters()["layer.weight"])


def test_an_offloaded_master_resumes_bitwise_from_its_checkpoint():
    on_device, offloaded = _master(False), _master(True)
    for coefficients in COEFFICIENTS[:2]:
        on_device.apply_update(coefficients, lr=1e-2, weight_decay=0.1)
        offloaded.apply_update(coefficients, lr=1e-2, weight_decay=0.1)
    saved = {name: tensor.clone() for name, tensor in offloaded.full_state_dict().items()}
    optimizer = {key: tensor.clone() for key, tensor in offloaded.optimizer_state().items()}

    resumed = _master(True)
    resumed.load_state_dict(saved)
    resumed.restore_optimizer(optimizer, offloaded.optimizer.metadata())
    resumed.apply_update(COEFFICIENTS[2], lr=1e-2, weight_decay=0.1)
    on_device.apply_update(COEFFICIENTS[2], lr=1e-2, weight_decay=0.1)
    _assert_same_tensors(resumed.state_dict(), dict(on_device.centre()))
    _assert_same_tensors(resumed.optimizer.state_dict(), on_device.optimizer.state_dict())


def test_an_overflowing_step_leaves_the_offloaded_master_as_it_was():
    master = _master(True, "sgd")
    before = {name: tensor.clone() for name, tensor in master.state_dict().items()}
    with pytest.raises(NonFiniteError, match="non-finite"):
        master.apply_update({1: 100.0}, lr=1e38)  # both finite in float32, but their steps overflow
    _assert_same_tensors(master.state_dict(), before)
