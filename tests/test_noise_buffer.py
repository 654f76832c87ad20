"""Drawing noise into reused memory gives exactly the noise of `parameter_noise`: the speed-up changes no value."""

import pytest
import torch

from trl_es.core.noise import NoiseBuffer, parameter_noise


@pytest.mark.parametrize("shape", [(1,), (15,), (16,), (17,), (3, 5), (64, 33), (1001, 7)])
def test_noise_written_into_a_buffer_is_bitwise_the_allocated_noise(shape):
    out = torch.full(shape, float("nan"))
    assert parameter_noise(7, "w", shape, out=out) is out
    assert torch.equal(out, parameter_noise(7, "w", shape))


def test_a_noise_buffer_draws_every_shape_exactly_in_any_order():
    shapes = {"a": (4, 4), "b": (100, 3), "c": (2,), "d": (50, 50)}
    buffer = NoiseBuffer()
    for name, shape in [*shapes.items(), *reversed(shapes.items())]:  # grows, then reuses the grown buffer
        assert torch.equal(buffer.draw(3, name, shape), parameter_noise(3, name, shape))


def test_a_noise_buffer_reuses_one_allocation_for_draws_that_fit():
    buffer = NoiseBuffer()
    first = buffer.draw(1, "w", (8, 8))
    second = buffer.draw(2, "v", (4, 4))
    assert second.data_ptr() == first.data_ptr()  # the same memory: a draw is valid until the next one
