"""Low-rank members (`trl_es.core.lowrank`): the factors and noise as pure functions, which parameters are
low-rank, frozen other parameters, and the update as the explicit sum of the members' low-rank noise."""

import pytest
import torch
from scripts.tiny_lowrank import RANK, SIGMA, lowrank_master, lowrank_model

from trl_es.core.fitness import update_coefficients
from trl_es.core.lowrank import lowrank_factors, lowrank_noise, lowrank_parameter_names
from trl_es.core.master import MasterWeights
from trl_es.core.noise import Member, population


def test_factors_are_a_pure_function_of_seed_name_shape_and_rank():
    a, b = lowrank_factors(7, "layers.0.q_proj.weight", (64, 32), rank=4)
    lowrank_factors(8, "unrelated", (3, 5), rank=1)  # draws in between change nothing
    again = lowrank_factors(7, "layers.0.q_proj.weight", (64, 32), rank=4)
    assert a.shape == (64, 4) and b.shape == (32, 4) and a.dtype == b.dtype == torch.float32
    assert torch.equal(a, again[0]) and torch.equal(b, again[1])
    for other in [
        lowrank_factors(7, "layers.1.q_proj.weight", (64, 32), rank=4),  # same shape, other matrix
        lowrank_factors(8, "layers.0.q_proj.weight", (64, 32), rank=4),  # other seed
    ]:
        assert not torch.equal(a, other[0]) and not torch.equal(b, other[1])
    assert not torch.equal(a[:, :2], lowrank_factors(7, "layers.0.q_proj.weight", (64, 32), rank=2)[0])


def test_lowrank_noise_has_unit_variance_so_sigma_keeps_its_meaning():
    noise = lowrank_noise(3, "w", (256, 256), rank=4)
    assert abs(noise.std() - 1) < 0.1
    assert torch.linalg.matrix_rank(noise) == 4


def test_linear_and_embedding_weights_are_lowrank_norms_and_biases_are_not(tokenizer):
    names = lowrank_parameter_names(
        lowrank_model(tokenizer), [n for n, _ in lowrank_model(tokenizer).named_parameters()]
    )
    assert "model.embed_tokens.weight" in names and "lm_head.weight" in names
    assert "model.layers.0.self_attn.q_proj.weight" in names and "model.layers.0.mlp.down_proj.weight" in names
    assert not any(name.endswith(("norm.weight", ".bias")) for name in names)


def test_frozen_other_parameters_are_neither_perturbed_nor_updated(tokenizer):
    model = lowrank_model(tokenizer)
    master = lowrank_master(model, "frozen")
    norm = "model.layers.0.input_layernorm.weight"
    before = master.tensors[norm].clone()
    assert torch.equal(dict(master.perturbed(Member(1)))[norm], before)
    master.apply_update({1: 0.5}, lr=0.1, weight_decay=0.1)
    assert torch.equal(master.tensors[norm], before)


@pytest.mark.parametrize("other_parameters", ["full", "frozen"])
def test_update_direction_is_the_explicit_sum_of_member_noise(tokenizer, other_parameters):
    model = lowrank_model(tokenizer)
    master = lowrank_master(model, other_parameters)
    members = population(base_seed=1, step=3, population_size=6, antithetic=True)
    shaped = torch.tensor([1.0, -0.5, 0.25, 0.25, -1.0, 2.0])
    coefficients = update_coefficients(members, shaped)  # antithetic pairs merged by seed
    full_rank = MasterWeights({name: t for name, t in master.tensors.items()}, SIGMA)
    for name, tensor in master.tensors.items():
        direction = master.update_direction(name, coefficients)
        if name in master.lowrank_names:
            expected = sum(
                m.sign * z / len(members) * lowrank_noise(m.seed, name, tensor.shape, RANK)
                for m, z in zip(members, shaped.tolist(), strict=True)
            )
        elif other_parameters == "full":
            expected = full_rank.update_direction(name, coefficients)
        else:
            expected = torch.zeros_like(tensor)
        torch.testing.assert_close(direction, expected, rtol=1e-5, atol=1e-6)

    start = {name: t.clone() for name, t in master.tensors.items()}
    norm = master.apply_update(coefficients, lr=1e-2)
    steps = {name: master.tensors[name] - start[name] for name in start}
    assert norm == pytest.approx(sum(float(s.double().pow(2).sum()) for s in steps.values()) ** 0.5, rel=1e-5)
