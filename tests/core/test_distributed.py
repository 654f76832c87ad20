"""Population-parallel ES across processes (`trl_es.core.distributed`): members dealt round-robin, a population that
must divide among the processes, and the ranks' agreement check, which compares per-tensor fingerprints that any
one-bit change of the master changes."""

from types import SimpleNamespace

import pytest
import torch

from trl_es.core.distributed import (
    Evaluators,
    check_population_divides,
    master_fingerprint,
    members_of_this_process,
)
from trl_es.core.master import MasterWeights
from trl_es.core.noise import population


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


def test_members_are_dealt_round_robin():
    members = population(0, step=0, population_size=6)
    shares = [members_of_this_process(SimpleNamespace(process_index=r, num_processes=3), members) for r in range(3)]
    assert shares == [members[0::3], members[1::3], members[2::3]]
    rounds = [share[j] for j in range(2) for share in shares]  # round j gathers members jP .. jP + P - 1
    assert rounds == members


def test_population_must_divide_among_processes():
    check_population_divides(30, 3)
    with pytest.raises(
        ValueError, match=r"population_size \(30\) must be a multiple of the number of processes \(4\)"
    ):
        check_population_divides(30, 4)


def test_processes_sharing_a_tensor_parallel_engine_evaluate_the_same_members_and_count_once():
    members = population(0, step=0, population_size=6)
    groups = [Evaluators(process, num_processes=4, group_size=2) for process in range(4)]
    assert [evaluators.members(members) for evaluators in groups] == [members[0::2]] * 2 + [members[1::2]] * 2
    per_process = torch.tensor([[10, 11, 12], [10, 11, 12], [20, 21, 22], [20, 21, 22]])  # one row per process
    assert groups[3].per_evaluator(per_process).tolist() == [[10, 11, 12], [20, 21, 22]]
    assert [groups[0].first_process(evaluator) for evaluator in range(2)] == [0, 2]


def test_population_must_divide_among_tensor_parallel_engines():
    check_population_divides(6, 4, group_size=2)  # 2 engines of 2 processes, 3 members each
    with pytest.raises(ValueError, match=r"tensor-parallel engines \(4 processes / 2 per engine = 2\).*Use 4 or 6"):
        check_population_divides(5, 4, group_size=2)
