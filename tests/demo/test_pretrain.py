"""Pretraining the embedded demo model (`trl_es.demo.pretrain`): its text misreads the stated fraction of problems, and
the same run gives the same weights bit for bit."""

import torch

from trl_es.demo.pretrain import MISREAD_FRACTION, pretrain, written_answer
from trl_es.tasks.arithmetic import problem


def test_pretraining_text_misreads_about_the_stated_fraction_of_problems():
    misread = [written_answer(i) != problem("pretrain", i).answer for i in range(2_000)]
    # a misread of a + 0 or a - 0 gives the right answer, so slightly fewer than MISREAD_FRACTION differ
    assert MISREAD_FRACTION - 0.1 < sum(misread) / len(misread) <= MISREAD_FRACTION + 0.03


def test_pretraining_is_deterministic(tmp_path):
    weights = []
    for run in ("a", "b"):
        model_dir = pretrain(tmp_path / run, max_steps=3, batch_size=8, num_examples=64, log=lambda *args: None)
        weights.append(_state(model_dir))
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][name], weights[1][name]) for name in weights[0])


def _state(model_dir):
    from safetensors.torch import load_file

    return load_file(model_dir / "model.safetensors")
