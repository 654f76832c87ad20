"""Sampling in `model.generate` with random numbers of our choosing (`trl_es.backends.gumbel`): a batched population's
members share their rows' numbers, and a row of `generate_rows` draws its own seed's, whatever else is in the batch."""

import pytest
import torch

from trl_es.backends.gumbel import CommonRandomGumbel, RowSeededGumbel, row_seeded_sampling


def test_common_gumbel_gives_every_member_the_same_random_numbers():
    processor = CommonRandomGumbel(seed=3, rows_per_member=2, temperature=0.7)
    scores = torch.zeros(6, 10)  # 3 members, equal logits: only the noise decides
    noisy = processor(torch.zeros(6, 4, dtype=torch.long), scores)
    assert torch.equal(noisy[0:2], noisy[2:4]) and torch.equal(noisy[0:2], noisy[4:6])
    assert not torch.equal(noisy[0], noisy[1])


def _noise_of_steps(seeds, prompt_width, steps=3, vocab=10):
    """The noise `RowSeededGumbel` adds at each of the first `steps` generated tokens (equal logits)."""
    processor = RowSeededGumbel(seeds)
    return [
        processor(torch.zeros(len(seeds), prompt_width + step, dtype=torch.long), torch.zeros(len(seeds), vocab))
        for step in range(steps)
    ]


def test_a_row_seeded_rows_numbers_depend_on_its_seed_and_step_alone():
    in_a_batch = _noise_of_steps([5, 8, 5], prompt_width=4)
    alone = _noise_of_steps([5], prompt_width=11)  # another batch, another padded width
    for step in range(3):
        assert torch.equal(in_a_batch[step][0], alone[step][0])
        assert torch.equal(in_a_batch[step][0], in_a_batch[step][2])  # one seed, one stream: common random numbers
        assert not torch.equal(in_a_batch[step][0], in_a_batch[step][1])
    assert not torch.equal(in_a_batch[0][0], in_a_batch[1][0])  # every generated token draws new numbers


def test_row_seeded_sampling_samples_the_tempered_softmax():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    temperature, rows = 0.7, 20000
    processors = row_seeded_sampling(list(range(rows)), temperature)
    scores = processors(torch.zeros(rows, 3, dtype=torch.long), logits.repeat(rows, 1))
    frequencies = torch.bincount(scores.argmax(dim=-1), minlength=4).float() / rows
    expected = torch.softmax(logits[0] / temperature, dim=-1)
    assert torch.allclose(frequencies, expected, atol=0.01), (frequencies, expected)


def test_row_seeded_gumbel_refuses_a_batch_without_one_seed_per_row():
    with pytest.raises(ValueError, match="holds 2 seeds for a batch of 3 rows"):
        RowSeededGumbel([1, 2])(torch.zeros(3, 4, dtype=torch.long), torch.zeros(3, 10))
    with pytest.raises(TypeError, match="integer seed for every row"):
        RowSeededGumbel([1, None])
    with pytest.raises(ValueError, match="temperature > 0"):
        RowSeededGumbel([1], temperature=0.0)
