import pytest
import torch

from trl_es.core.lowrank import LowRankMasterWeights
from trl_es.core.master import MasterWeights
from trl_es.core.noise import Member, parameter_noise


def _parameters(dtype=torch.float32):
    torch.manual_seed(0)
    return {"a.weight": torch.randn(8, 4).to(dtype), "b.bias": torch.randn(4).to(dtype)}


def test_member_is_master_plus_signed_scaled_noise():
    master = MasterWeights(_parameters(), sigma=0.1)
    perturbed = dict(master.perturbed(Member(5, sign=-1)))
    expected = master.tensors["a.weight"] - 0.1 * parameter_noise(5, "a.weight", (8, 4))
    assert torch.allclose(perturbed["a.weight"], expected)


def test_update_is_lr_times_weighted_noise_sum_in_float32():
    params = _parameters(torch.bfloat16)
    master = MasterWeights(params, sigma=0.1)
    start = {name: t.clone() for name, t in master.tensors.items()}
    coefficients = {1: 0.5, 2: -0.25}
    norm = master.apply_update(coefficients, lr=1e-3)
    squared_norm = 0.0
    for name, tensor in master.tensors.items():
        assert tensor.dtype == torch.float32
        direction = 0.5 * parameter_noise(1, name, tensor.shape) - 0.25 * parameter_noise(2, name, tensor.shape)
        assert torch.allclose(tensor, start[name] + 1e-3 * direction, atol=1e-7)
        squared_norm += (1e-3 * direction).double().pow(2).sum().item()
    assert norm == pytest.approx(squared_norm**0.5, rel=1e-6)


def test_small_update_survives_in_the_float32_master_though_bf16_would_lose_it():
    params = {"w": torch.ones(1000, dtype=torch.bfloat16)}
    master = MasterWeights(params, sigma=0.1)
    master.apply_update({3: 1.0}, lr=5e-4)
    changed_in_master = (master.tensors["w"] != 1.0).float().mean()
    changed_in_bf16 = (master.tensors["w"].to(torch.bfloat16) != 1.0).float().mean()
    assert changed_in_master == 1.0
    assert changed_in_bf16 < 0.5  # the reason for the master: most of a bf16 step of 5e-4 rounds away


def test_weight_decay_is_decoupled():
    master = MasterWeights({"w": torch.full((3,), 2.0)}, sigma=0.1)
    master.apply_update({}, lr=0.1, weight_decay=0.5)
    assert torch.allclose(master.tensors["w"], torch.full((3,), 2.0 * (1 - 0.1 * 0.5)))


def test_zero_coefficients_leave_the_master_bitwise_unchanged():
    master = MasterWeights(_parameters(), sigma=0.1)
    before = {name: t.clone() for name, t in master.tensors.items()}
    assert master.apply_update({1: 0.0, 2: 0.0}, lr=1e-3) == 0.0
    assert all(torch.equal(master.tensors[n], before[n]) for n in before)


def test_relative_distance():
    master = MasterWeights({"w": torch.tensor([3.0, 4.0])}, sigma=0.1)
    assert master.relative_distance({"w": torch.tensor([3.0, 4.0])}) == 0.0
    assert abs(master.relative_distance({"w": torch.tensor([0.0, 4.0])}) - 3 / 4) < 1e-9


def test_a_shared_master_updates_float32_parameters_in_place_and_copies_the_others():
    parameters = {"w": torch.randn(4, 3), "b": torch.randn(3).to(torch.bfloat16)}
    master = MasterWeights(parameters, sigma=0.1, share_float32=True)
    assert master.tensors["w"].data_ptr() == parameters["w"].data_ptr()  # no second float32 copy
    assert master.tensors["b"].dtype == torch.float32 and master.tensors["b"].data_ptr() != parameters["b"].data_ptr()
    before = parameters["w"].clone()
    master.apply_update({7: 1.0}, lr=0.1)
    assert not torch.equal(parameters["w"], before)  # the update landed in the parameter itself


@pytest.mark.parametrize("kind", ["float32", "lowrank"])  # a compensated pair's split reads values: not on "meta"
def test_a_master_built_for_another_device_holds_copies_there_and_shares_no_parameter(kind):
    # A model kept in host memory gets its master on the accelerator; "meta" stands in for it on this CPU machine.
    parameters = {"w": torch.randn(4, 3), "b": torch.randn(3).to(torch.bfloat16)}
    build = {
        "float32": lambda: MasterWeights(parameters, 0.1, share_float32=True, device="meta"),
        "lowrank": lambda: LowRankMasterWeights(parameters, 0.1, {"w"}, rank=1, share_float32=True, device="meta"),
    }
    master = build[kind]()
    assert master.device == torch.device("meta")
    assert {name: tensor.device.type for name, tensor in master.tensors.items()} == {"w": "meta", "b": "meta"}
    assert master.shared == set()  # a parameter on another device cannot be its own master
    assert master.nbytes() == 4 * (12 + 3)  # float32 for every element
    assert all(param.device.type == "cpu" for param in parameters.values())


def test_the_cpu_with_an_index_is_the_cpu_whose_float32_parameters_the_master_shares():
    # ESTrainer passes `args.device`, which Accelerate names cpu:0 in a CPU process where LOCAL_RANK is set.
    parameters = {"w": torch.randn(4, 3), "b": torch.randn(3).to(torch.bfloat16)}
    master = MasterWeights(parameters, 0.1, share_float32=True, device="cpu:0")
    assert master.device == torch.device("cpu") and master.shared == {"w"}
    assert master.holds("w", parameters["w"]) and not master.holds("b", parameters["b"])


def test_a_saved_master_of_a_broadcastable_shape_is_refused():
    master = MasterWeights({"norm.weight": torch.ones(4)}, sigma=0.1)
    with pytest.raises(ValueError, match=r"'norm.weight' is a torch.float32 tensor of shape \(1,\)"):
        master.load_state_dict({"norm.weight": torch.zeros(1)})  # copy_ would broadcast it
    with pytest.raises(ValueError, match="torch.float16"):
        master.load_state_dict({"norm.weight": torch.zeros(4, dtype=torch.float16)})
    assert torch.equal(master.tensors["norm.weight"], torch.ones(4))
