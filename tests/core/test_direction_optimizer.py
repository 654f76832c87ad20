"""The optimizer on the ES direction (`trl_es.core.direction_optimizer`): momentum and Adam against a hand computation
and against torch's own optimizers, inside the master's update, and its state saved and refused."""

import pytest
import torch

from trl_es.core.direction_optimizer import DirectionOptimizer, DirectionOptimizerSettings
from trl_es.core.master import MasterWeights
from trl_es.core.noise import parameter_noise

DIRECTIONS = [torch.tensor([1.0, -2.0, 0.5]), torch.tensor([0.5, 1.0, 0.0]), torch.tensor([-1.0, 3.0, 2.0])]


def steps_of(settings: DirectionOptimizerSettings) -> list[torch.Tensor]:
    optimizer = DirectionOptimizer(settings)
    found = []
    for direction in DIRECTIONS:
        optimizer.begin_update()
        found.append(optimizer.step("w", direction.clone()))
    return found


def test_plain_es_steps_along_the_direction_and_keeps_no_state():
    optimizer = DirectionOptimizer()
    optimizer.begin_update()
    assert torch.equal(optimizer.step("w", DIRECTIONS[0].clone()), DIRECTIONS[0]) and optimizer.state_dict() == {}


def test_momentum_steps_along_the_decayed_sum_of_directions():
    first, second, third = steps_of(DirectionOptimizerSettings("momentum", momentum=0.5))
    assert torch.equal(first, DIRECTIONS[0])
    assert torch.allclose(second, 0.5 * DIRECTIONS[0] + DIRECTIONS[1])
    assert torch.allclose(third, 0.25 * DIRECTIONS[0] + 0.5 * DIRECTIONS[1] + DIRECTIONS[2])


def test_adam_steps_by_the_bias_corrected_ratio_of_its_moments():
    beta1, beta2, epsilon = 0.9, 0.99, 1e-8
    found = steps_of(DirectionOptimizerSettings("adam", beta1=beta1, beta2=beta2, epsilon=epsilon))
    m, v = torch.zeros(3), torch.zeros(3)
    for t, (direction, step) in enumerate(zip(DIRECTIONS, found, strict=True), start=1):
        m, v = beta1 * m + (1 - beta1) * direction, beta2 * v + (1 - beta2) * direction**2
        by_hand = (m / (1 - beta1**t)) / ((v / (1 - beta2**t)).sqrt() + epsilon)
        assert torch.allclose(step, by_hand, atol=1e-6), t
    assert torch.allclose(found[0], DIRECTIONS[0].sign(), atol=1e-6)  # Adam's first step: the sign, size 1


@pytest.mark.parametrize(
    ("settings", "torch_optimizer"),
    [
        (DirectionOptimizerSettings("momentum", momentum=0.9), lambda p: torch.optim.SGD([p], lr=0.1, momentum=0.9)),
        (DirectionOptimizerSettings("adam"), lambda p: torch.optim.Adam([p], lr=0.1)),
    ],
)
def test_the_update_ascends_as_torch_optimizers_descend_the_negated_direction(settings, torch_optimizer):
    start = {"w": torch.tensor([0.3, -0.1, 2.0])}
    master = MasterWeights(start, sigma=1e-3)
    master.optimizer = DirectionOptimizer(settings)
    reference = start["w"].clone().requires_grad_(True)
    optimizer = torch_optimizer(reference)
    for seed in (1, 2, 3):
        master.apply_update({seed: 0.7}, lr=0.1)
        reference.grad = -0.7 * parameter_noise(seed, "w", reference.shape)
        optimizer.step()
    assert torch.allclose(master.tensors["w"], reference.detach(), atol=1e-6)


def test_the_state_round_trips_and_continues_bitwise():
    settings = DirectionOptimizerSettings("adam")
    uninterrupted, first = DirectionOptimizer(settings), DirectionOptimizer(settings)
    for optimizer in (uninterrupted, first):
        optimizer.begin_update()
        optimizer.step("w", DIRECTIONS[0].clone())
    resumed = DirectionOptimizer(settings)
    resumed.load_state_dict(first.state_dict(), first.metadata(), {"w": torch.Size([3])})
    for optimizer in (uninterrupted, resumed):
        optimizer.begin_update()
    assert torch.equal(uninterrupted.step("w", DIRECTIONS[1].clone()), resumed.step("w", DIRECTIONS[1].clone()))


def test_a_state_of_another_optimizer_or_model_is_refused_by_name():
    momentum = DirectionOptimizer(DirectionOptimizerSettings("momentum"))
    momentum.begin_update()
    momentum.step("w", DIRECTIONS[0].clone())
    with pytest.raises(
        ValueError, match="written with es_optimizer='momentum', but this run uses es_optimizer='adam'"
    ):
        DirectionOptimizer(DirectionOptimizerSettings("adam")).load_state_dict(
            momentum.state_dict(), momentum.metadata(), {"w": torch.Size([3])}
        )
    with pytest.raises(ValueError, match=r"missing \['v.momentum'\]"):
        DirectionOptimizer(DirectionOptimizerSettings("momentum")).load_state_dict(
            momentum.state_dict(), momentum.metadata(), {"w": torch.Size([3]), "v": torch.Size([2])}
        )
    with pytest.raises(ValueError, match="must be float32 of shape \\(4,\\)"):
        DirectionOptimizer(DirectionOptimizerSettings("momentum")).load_state_dict(
            momentum.state_dict(), momentum.metadata(), {"w": torch.Size([4])}
        )


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"name": "lion"}, "Unknown es_optimizer='lion'; use one of sgd, momentum, adam"),
        ({"name": "momentum", "momentum": 1.0}, r"es_momentum must be a number in \[0, 1\), got 1.0"),
        ({"name": "adam", "beta2": -0.1}, "adam_beta2 must be a number"),
        ({"name": "adam", "epsilon": 0.0}, "adam_epsilon must be a finite number > 0, got 0.0"),
    ],
)
def test_bad_settings_are_refused_naming_the_field(settings, message):
    with pytest.raises(ValueError, match=message):
        DirectionOptimizerSettings(**settings)
