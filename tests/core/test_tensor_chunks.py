"""Slices of large tensors (`trl_es.core.tensor_chunks`): elementwise work a slice at a time writes the same bits as
over the whole tensor, and the reductions read a tensor without copying it."""

import math

import pytest
import torch

from trl_es.core import tensor_chunks
from trl_es.core.tensor_chunks import (
    flat_slices,
    largest_magnitude,
    squared_distance,
    squared_norm,
    sum_and_squares,
)


@pytest.fixture
def slices_of_seven(monkeypatch):
    monkeypatch.setattr(tensor_chunks, "SLICE_ELEMENTS", 7)


def test_slices_cover_matching_elements_in_order_and_write_through(slices_of_seven):
    values, out = torch.arange(30.0).reshape(5, 6), torch.zeros(5, 6)
    parts = list(flat_slices(values, out))
    assert [len(part) for part, _ in parts] == [7, 7, 7, 7, 2]
    for part, out_part in parts:
        out_part.copy_(part * 2)
    assert torch.equal(out, values * 2)


def test_tensors_without_a_flat_view_come_whole_once(slices_of_seven):
    values = torch.arange(30.0).reshape(5, 6).t()  # a transpose: not contiguous
    (parts,) = list(flat_slices(values, torch.zeros(6, 5)))
    assert parts[0] is values


def test_the_sum_and_the_squares_are_summed_in_float64_across_slices_after_the_cast(slices_of_seven):
    values = torch.randn(5, 6, generator=torch.Generator().manual_seed(0)) * 1e3
    total, squares = sum_and_squares(values).tolist()
    assert math.isclose(total, float(values.double().sum()), rel_tol=1e-14)
    assert math.isclose(squares, float(values.double().pow(2).sum()), rel_tol=1e-14)
    assert squared_norm(values) == squares and squared_norm(torch.zeros(0)) == 0.0
    cast = values.to(torch.bfloat16).double()  # the cast rounds each value before it is summed
    assert sum_and_squares(values, torch.bfloat16).tolist() == pytest.approx(
        [float(cast.sum()), float(cast.pow(2).sum())], 1e-14
    )


def test_the_squared_distance_casts_both_to_float32_and_sums_in_float64_across_slices(slices_of_seven):
    generator = torch.Generator().manual_seed(1)
    master, start = torch.randn(5, 6, generator=generator), torch.randn(5, 6, generator=generator).bfloat16()
    expected = float((master - start.float()).double().pow(2).sum())
    assert math.isclose(squared_distance(master, start), expected, rel_tol=1e-14)


def test_the_largest_magnitude_is_the_largest_absolute_value_or_nan():
    assert largest_magnitude(torch.tensor([1.0, -3.5, 2.0])) == 3.5
    assert largest_magnitude(torch.tensor([1.0, 3.5], dtype=torch.bfloat16)) == 3.5
    assert largest_magnitude(torch.zeros(0)) == 0.0
    assert largest_magnitude(torch.tensor([-math.inf, 1.0])) == math.inf
    assert math.isnan(largest_magnitude(torch.tensor([1.0, math.nan, -2.0])))


def test_the_largest_magnitude_of_a_parameter_reads_it_without_a_warning(recwarn):
    # first_non_finite reads a model's parameters before a save; float() of their aminmax warned about requires_grad
    assert largest_magnitude(torch.nn.Parameter(torch.tensor([1.0, -2.0]))) == 2.0
    assert not [warning for warning in recwarn if "requires_grad" in str(warning.message)]
