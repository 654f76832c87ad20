"""The compensated bfloat16 master (`trl_es.core.compensated`): over 200 ES-sized steps it stays within a stated
tolerance of a float32 master in half the bytes, where a plain bfloat16 master loses the steps; members and
checkpoints read its float32 values."""

import torch

from trl_es.core.compensated import CompensatedMasterWeights, add_, join, split
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


def test_members_and_checkpoints_read_the_float32_values_of_the_pairs():
    parameters = bfloat16_parameters()
    master = CompensatedMasterWeights(parameters, sigma=0.02)
    master.apply_update({derive_seed(0, 0, 0): 1.0}, lr=1e-4)
    saved = {name: tensor.clone() for name, tensor in master.state_dict().items()}
    assert all(tensor.dtype == torch.float32 for tensor in saved.values())
    member = Member(derive_seed(0, 1, 0))
    expected = {name: saved[name] + 0.02 * parameter_noise(member.seed, name, saved[name].shape) for name in saved}
    assert all(torch.equal(tensor, expected[name]) for name, tensor in master.perturbed(member))
    restored = CompensatedMasterWeights(parameters, sigma=0.02)
    restored.load_state_dict(saved)  # a resume: the same values, so the same updates from here on
    assert all(torch.equal(restored.tensors[name], saved[name]) for name in saved)
