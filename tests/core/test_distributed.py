"""The ranks' agreement check compares per-tensor fingerprints that any one-bit change of the master changes."""

import torch

from trl_es.core.distributed import master_fingerprint
from trl_es.core.master import MasterWeights


def test_the_smallest_change_of_one_weight_changes_its_tensors_fingerprint_only():
    torch.manual_seed(0)
    master = MasterWeights({"a": torch.randn(5, 3), "b": torch.randn(4)}, sigma=0.1)
    before = master_fingerprint(master)
    weight = master.tensors["a"].view(-1)[3]
    weight.copy_(torch.nextafter(weight, torch.tensor(float("inf"))))
    after = master_fingerprint(master)
    assert after[0] != before[0] and after[1] == before[1]


def test_equal_masters_have_equal_fingerprints():
    weights = {"a": torch.randn(7, 2), "b": torch.zeros(3)}
    assert master_fingerprint(MasterWeights(weights, 0.1)) == master_fingerprint(MasterWeights(weights, 0.2))
