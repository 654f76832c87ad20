"""The compensated bfloat16 master (`trl_es.core.compensated`): over 200 ES-sized steps it stays within a stated
tolerance of a float32 master in half the bytes, where a plain bfloat16 master loses the steps; members and
checkpoints read its float32 values."""

import math

import pytest
import torch

from trl_es.core import tensor_chunks
from trl_es.core.compensated import CompensatedMasterWeights, add_, join, largest_magnitude_of, split
from trl_es.core.master import MasterWeights
from trl_es.core.noise import Member, derive_seed, parameter_noise

STEPS = 200
# Each addition is exact to within the residual's rounding: at most 2^-9 of half a unit of `high` (2^-9 of the
# weight), so 2^-18 of the weight per step; 200 such errors in the worst case add to 200 * 2^-18 (7.6e-4) of it.
TOLERANCE_PER_STEP = 2.0**-18


def es_steps(shape=(256, 64), seed=0):
    generator = torch.Generator().manual_seed(seed)
    start = torch.randn(shape, generator=generator) * 0.05
    steps = [5e-4 * 0.05 * torch.randn(shape, generator=generator) for _ in range(STEPS)]  # lr 5e-4 of the scale
    return start, steps


def test_a_value_splits_into_a_pair_that_holds_it_to_sixteen_bits():
    value = torch.randn(10_000) * 3
    high, low = split(value)
    assert high.dtype == low.dtype == torch.bfloat16
    assert torch.all((join(high, low) - value).abs() <= value.abs() * 2.0**-16)


def test_200_es_steps_stay_within_the_stated_tolerance_of_a_float32_master():
    start, steps = es_steps()
    reference, (high, low) = start.clone(), split(start)
    plain = start.to(torch.bfloat16)
    for step in steps:
        reference += step
        add_(high, low, step)
        plain += step.to(torch.bfloat16)
    error = (join(high, low) - reference).abs()
    scale = reference.abs().clamp_min(start.abs().max() * 2.0**-8)
    assert torch.all(error <= STEPS * TOLERANCE_PER_STEP * scale)
    moved = (reference - start).abs().mean()
    assert (join(high, low) - reference).abs().mean() < 0.01 * moved  # the compensated master followed the run
    assert (plain.float() - reference).abs().mean() > 0.3 * moved  # a plain bfloat16 master lost much of it


def test_a_step_below_the_resolution_of_high_is_kept_and_accumulates():
    (high, low), plain = split(torch.ones(4)), torch.ones(4, dtype=torch.bfloat16)
    for _ in range(100):
        add_(high, low, torch.full((4,), 1e-4))  # bfloat16's unit at 1.0 is 2^-7: each step alone rounds away
        plain += 1e-4
    assert torch.allclose(join(high, low), torch.full((4,), 1.01), rtol=0, atol=100 * TOLERANCE_PER_STEP * 1.01)
    assert torch.equal(plain, torch.ones(4, dtype=torch.bfloat16))


def bfloat16_parameters(seed=0):
    generator = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": (torch.randn(64, 32, generator=generator) * 0.05).bfloat16(),
        "layer.weight": (torch.randn(32, 32, generator=generator) * 0.05).bfloat16(),
        "norm.weight": torch.ones(32, dtype=torch.bfloat16),
    }


def test_the_compensated_master_adds_half_the_bytes_and_follows_the_float32_master_over_200_updates():
    parameters = bfloat16_parameters()
    model = {name: tensor.clone() for name, tensor in parameters.items()}  # holds the centre, as beside vLLM
    exact, compensated = MasterWeights(parameters, 0.02), CompensatedMasterWeights(model, 0.02, share_bfloat16=True)
    count = sum(p.numel() for p in parameters.values())
    assert (exact.nbytes(), compensated.nbytes()) == (4 * count, 2 * count)  # the model's bfloat16 is the high half
    generator = torch.Generator().manual_seed(1)
    for step in range(STEPS):  # ES updates of lr 5e-4 from 8 members' z-scored fitness, with weight decay
        coefficients = {derive_seed(0, step, k): float(torch.randn((), generator=generator)) / 8 for k in range(8)}
        exact.apply_update(coefficients, lr=5e-4, weight_decay=0.01)
        compensated.apply_update(coefficients, lr=5e-4, weight_decay=0.01)
    for name, start in parameters.items():
        reference, value = exact.tensors[name], compensated.tensors[name]
        scale = reference.abs().clamp_min(start.float().abs().max() * 2.0**-8)
        assert torch.all((value - reference).abs() <= STEPS * TOLERANCE_PER_STEP * scale), name
        moved = (reference - start.float()).abs().mean()
        assert (value - reference).abs().mean() < 0.05 * moved, name  # norms near 1: 1.1% measured
        assert torch.equal(model[name], compensated.pairs[name][0]) and compensated.holds(name, model[name])
        assert torch.equal(value.bfloat16(), model[name])  # an engine casting the values holds the model's weights


def test_a_pair_left_on_a_tie_moves_high_to_where_a_cast_rounds():
    odd = 1.0 + 2.0**-7  # a bfloat16 with an odd last bit: a cast rounds a tie away from it
    value = torch.tensor([odd + 2.0**-8 - 2.0**-20])  # just below half a unit above it: rounds down to it...
    high, low = split(value)
    # ...but the rest, 2^-8 - 2^-20, rounds to 2^-8 in bfloat16: the pair sits on the tie, and high moves up
    assert join(high, low).item() == odd + 2.0**-8
    assert high.item() == 1.0 + 2.0**-6 and torch.equal(join(high, low).bfloat16(), high)


def test_a_bfloat16_parameter_on_the_cpu_named_with_an_index_is_the_value_half():
    # ESTrainer passes `args.device`, which Accelerate names cpu:0 in a CPU process where LOCAL_RANK is set.
    parameter = torch.randn(4, 3).to(torch.bfloat16)
    master = CompensatedMasterWeights({"w": parameter}, 0.1, share_bfloat16=True, device="cpu:0")
    assert master.holds("w", parameter) and master.nbytes() == 2 * parameter.numel()


@pytest.mark.parametrize("slice_elements", [5, 1 << 20])
def test_members_updates_and_loads_of_the_pairs_are_the_bits_of_the_whole_tensor_formulas(monkeypatch, slice_elements):
    # The master works a slice at a time (`tensor_chunks`); sliced or not, every bit is the formula's on the whole
    # tensor: a member is (noise * sign * sigma + join).to(dtype), an update split(join * decay + lr * direction).
    monkeypatch.setattr(tensor_chunks, "SLICE_ELEMENTS", slice_elements)
    master = CompensatedMasterWeights(bfloat16_parameters(), 0.02)
    pairs = {name: (high.clone(), low.clone()) for name, (high, low) in master.pairs.items()}
    member = Member(seed=7, sign=-1)
    for name, value in master.perturbed(member, torch.bfloat16):
        noise = parameter_noise(member.seed, name, value.shape)
        assert torch.equal(value, (noise * (-0.02) + join(*pairs[name])).to(torch.bfloat16)), name
    coefficients, lr, weight_decay = {3: 0.5, 4: -0.25}, 1e-3, 0.1
    norm = master.apply_update(coefficients, lr, weight_decay)
    squared = 0.0
    for name, (high, low) in pairs.items():
        step = master.update_direction(name, coefficients).mul_(lr)
        squared += float(step.double().pow(2).sum())
        expected = split(join(high, low).mul_(1 - lr * weight_decay).add_(step))
        assert all(map(torch.equal, master.pairs[name], expected)), name
    assert math.isclose(norm, math.sqrt(squared), rel_tol=1e-12)
    saved = {name: torch.randn(high.shape) for name, (high, _) in pairs.items()}
    master.load_state_dict(saved)
    assert all(all(map(torch.equal, master.pairs[name], split(saved[name]))) for name in saved)


def test_the_bfloat16_centre_is_each_pairs_high_half_the_value_cast():
    master = CompensatedMasterWeights(bfloat16_parameters(), 0.02)
    for step in range(20):  # enough updates that some pairs sit on a tie (`split`)
        master.apply_update({derive_seed(0, step, k): 0.3 - 0.1 * k for k in range(4)}, lr=5e-3)
    for name, centre in master.centre(torch.bfloat16):
        high, low = master.pairs[name]
        assert centre is high and torch.equal(join(high, low).bfloat16(), high), name
    for name, centre in master.centre(torch.float16):
        assert torch.equal(centre, join(*master.pairs[name]).half()), name


def test_the_largest_magnitude_of_a_pair_finds_a_nan_in_any_slice(monkeypatch):
    monkeypatch.setattr(tensor_chunks, "SLICE_ELEMENTS", 2)
    high, low = split(torch.tensor([1.0, -4.0, 2.0, 3.0, 0.5]))
    assert largest_magnitude_of(high, low) == 4.0
    high[3] = math.nan  # in the second slice
    assert math.isnan(largest_magnitude_of(high, low))
