"""Divergence guards (`trl_es.core.guards`): a non-finite update is refused before it is applied, naming the cause
(issue 16, point 1); an infinite reward is found, and NaN is not one; fitness that overflows names the reward
weights."""

import math

import pytest
import torch

from trl_es.core.guards import (
    NonFiniteError,
    check_finite_tensors,
    check_fitness,
    first_infinite_reward,
    first_non_finite,
)
from trl_es.core.lowrank import LowRankMasterWeights
from trl_es.core.master import MasterWeights


def _master(value=1.0):
    return MasterWeights({"a.weight": torch.full((3, 2), value), "b.bias": torch.full((2,), value)}, sigma=0.1)


def _unchanged(master, value=1.0):
    return all(torch.equal(t, torch.full_like(t, value)) for t in master.tensors.values())


@pytest.mark.parametrize(
    ("update", "cause"),
    [
        (dict(coefficients={1: float("nan")}, lr=0.1), "coefficients of 1 members are not finite"),
        (dict(coefficients={1: 0.5}, lr=1e39), r"learning_rate=1e\+39 is not finite in float32"),
        (dict(coefficients={1: 0.5}, lr=0.1, weight_decay=float("nan")), "weight_decay"),
    ],
)
def test_a_non_finite_update_is_refused_before_any_weight_changes(update, cause):
    master = _master()
    with pytest.raises(NonFiniteError, match=cause):
        master.apply_update(**update)
    assert _unchanged(master)


def test_an_update_that_would_overflow_float32_is_refused_naming_the_learning_rate():
    master = _master(3e38)
    with pytest.raises(NonFiniteError, match=r"update of 'a.weight' would make it non-finite.*Lower learning_rate"):
        master.apply_update({1: 1.0}, lr=1e38)
    assert _unchanged(master, 3e38)


@pytest.mark.parametrize(("dtype", "limit"), [(torch.float16, r"6.55e\+04"), (torch.bfloat16, r"3.39e\+38")])
def test_an_update_that_overflows_the_parameters_own_dtype_is_refused(dtype, limit):
    """Issue 27: the float32 master of a float16 model stayed finite while the model's weights became infinite."""
    parameters = {"a.weight": torch.full((3, 2), 6e4, dtype=dtype), "b.bias": torch.ones(2, dtype=dtype)}
    master = MasterWeights(parameters, sigma=0.1)
    lr = 1e4 if dtype == torch.float16 else 3.39e38
    refusal = rf"update of 'a.weight' .* the parameter's {str(dtype)[6:]} holds up to {limit}"
    with pytest.raises(NonFiniteError, match=refusal):
        master.apply_update({1: 1.0}, lr=lr)
    assert torch.equal(master.tensors["a.weight"], parameters["a.weight"].float())
    master.apply_update({1: 1.0}, lr=1.0)  # a step that stays in range is taken
    assert all(torch.isfinite(tensor.to(dtype)).all() for tensor in master.tensors.values())


def test_an_overflow_found_partway_leaves_every_tensor_finite_and_names_the_one_that_overflowed():
    # The documented exception: tensors are stepped one at a time (the update of a whole model is not held at once),
    # so those before the overflowing one have taken their finite step; training stops and names the checkpoint.
    master = MasterWeights({"a.weight": torch.full((3, 2), 1.0), "b.bias": torch.full((2,), 3e38)}, sigma=0.1)
    with pytest.raises(NonFiniteError, match="update of 'b.bias' would make it non-finite"):
        master.apply_update({1: 1.0}, lr=1e38)
    assert torch.equal(master.tensors["b.bias"], torch.full((2,), 3e38))
    assert not torch.equal(master.tensors["a.weight"], torch.full((3, 2), 1.0))
    assert all(torch.isfinite(tensor).all() for tensor in master.tensors.values())


def test_a_low_rank_update_is_guarded_too():
    master = LowRankMasterWeights({"a.weight": torch.full((3, 2), 3e38)}, 0.1, {"a.weight"}, rank=1)
    with pytest.raises(NonFiniteError, match="'a.weight'"):
        master.apply_update({1: 1.0}, lr=1e38)
    assert torch.equal(master.tensors["a.weight"], torch.full((3, 2), 3e38))


def test_an_infinite_reward_is_found_and_nan_is_not_one():
    rewards = torch.tensor([[[0.5], [float("nan")]], [[1.0], [-float("inf")]]])  # (members, completions, functions)
    assert first_infinite_reward(rewards) == (1, 1, 0)
    assert first_infinite_reward(torch.tensor([[[float("nan")]]])) is None


def test_fitness_that_overflows_names_the_reward_weights():
    with pytest.raises(NonFiniteError, match=r"reward_weights=\[1e\+38\]"):
        check_fitness(torch.tensor([1.0, float("inf")]), [1e38])


def test_the_finite_check_names_the_first_tensor_with_nan_or_infinity_and_counts_its_entries():
    finite = {"empty": torch.zeros(0), "half": torch.ones(3, dtype=torch.bfloat16), "ids": torch.arange(3)}
    assert first_non_finite(finite) is None
    bad = finite | {"a": torch.tensor([1.0, math.inf, -math.inf, 2.0]), "b": torch.tensor([math.nan])}
    assert first_non_finite(bad) == ("a", 2)
    assert first_non_finite({"b": torch.tensor([0.0, math.nan], dtype=torch.float16)}) == ("b", 1)
    with pytest.raises(NonFiniteError, match=r"'a' has 2 NaN or infinite entries"):
        check_finite_tensors(bad, "The weights")
