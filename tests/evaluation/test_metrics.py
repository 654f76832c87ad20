"""Pass@k, Maj@k and JS diversity against values worked out by hand; es/param_distance's starting weights live in a
file, not in memory, and read back bitwise."""

import gc
import os

import pytest
import torch
from safetensors.torch import load_file

from trl_es.core.master import MasterWeights
from trl_es.evaluation.metrics import StartingWeights, bernoulli_entropy, js_diversity, maj_at_k, pass_at_k


@pytest.mark.parametrize(
    "n, c, k, expected",
    [
        (4, 1, 2, 1 - 3 / 6),  # 1 - C(3,2)/C(4,2)
        (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2)/C(5,2)
        (10, 3, 1, 0.3),  # Pass@1 is the fraction correct
        (8, 0, 4, 0.0),  # nothing correct
        (8, 8, 4, 1.0),  # everything correct
        (8, 5, 4, 1.0),  # fewer than k wrong samples: any k contain a correct one
    ],
)
def test_pass_at_k_matches_the_hand_computed_value(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected)


@pytest.mark.parametrize("n, c, k", [(4, 1, 5), (4, 1, 0), (4, 5, 2), (4, -1, 2)])
def test_pass_at_k_rejects_impossible_arguments(n, c, k):
    with pytest.raises(ValueError, match="k=|c="):
        pass_at_k(n, c, k)


def test_maj_at_k_over_all_samples_is_the_plain_vote():
    assert maj_at_k(["3", "3", "5", None], "3", k=4) == 1.0
    assert maj_at_k(["5", "3", "5", None], "3", k=4) == 0.0
    assert maj_at_k([None, None], "3", k=2) == 0.0  # no answer never wins


def test_maj_at_k_breaks_ties_by_first_answer_seen():
    assert maj_at_k(["3", "5"], "3", k=2) == 1.0
    assert maj_at_k(["5", "3"], "3", k=2) == 0.0


def test_maj_at_1_is_the_mean_accuracy_and_subsets_are_averaged():
    answers = ["1", "1", "2"]
    assert maj_at_k(answers, "1", k=1) == pytest.approx(2 / 3)
    # k=2: subsets {1,1} -> 1, {1,2} -> 1 (first seen), {1,2} -> 1
    assert maj_at_k(answers, "1", k=2) == 1.0
    assert maj_at_k(answers, "2", k=2) == 0.0


def test_maj_at_k_samples_subsets_reproducibly_when_there_are_too_many():
    answers = ["1"] * 10 + ["2"] * 10
    first = maj_at_k(answers, "1", k=5, max_subsets=200, seed=3)
    assert first == maj_at_k(answers, "1", k=5, max_subsets=200, seed=3)
    assert 0.3 < first < 0.7  # symmetric answers: the vote goes either way about equally often


def test_maj_at_k_rejects_k_above_the_number_of_samples():
    with pytest.raises(ValueError, match="k=3 with n=2"):
        maj_at_k(["1", "2"], "1", k=3)


def test_js_diversity_is_zero_for_identical_members():
    assert js_diversity([0.3, 0.3, 0.3]) == pytest.approx(0.0)


def test_js_diversity_is_one_bit_for_a_maximally_split_population():
    assert js_diversity([1.0, 0.0]) == pytest.approx(1.0)
    assert js_diversity([1.0, 1.0, 0.0, 0.0]) == pytest.approx(1.0)


def test_js_diversity_lies_between_the_extremes():
    value = js_diversity([0.9, 0.1])
    assert value == pytest.approx(1.0 - bernoulli_entropy(0.9))
    assert 0.0 < value < 1.0


def test_bernoulli_entropy_rejects_non_probabilities():
    with pytest.raises(ValueError, match="p=1.5"):
        bernoulli_entropy(1.5)


def test_the_population_diversity_of_a_step_reads_consecutive_completions_as_one_prompt():
    from trl_es.evaluation.metrics import population_diversity

    # 2 members x (2 prompts x 2 completions): they split on the first prompt and agree on the second
    rewards = torch.tensor([[1.0, 1.0, 0.0, 1.0], [0.0, 0.0, 0.0, 1.0]])
    assert population_diversity(rewards, num_generations=2, success_threshold=0.0) == pytest.approx((1.0 + 0.0) / 2)
    assert population_diversity(rewards, num_generations=2, success_threshold=1.0) == 0.0  # nothing is above 1


@pytest.mark.slow
def test_es_logs_js_diversity_when_members_sample_several_completions(make_config, tmp_path):
    from trl_es import ESTrainer
    from trl_es.demo.run import DEMO_MODEL
    from trl_es.tasks.arithmetic import arithmetic_dataset, arithmetic_reward

    config = make_config(num_generations=2, temperature=1.0, sigma=0.05, max_completion_length=4)
    trainer = ESTrainer(
        model=str(DEMO_MODEL),
        reward_funcs=arithmetic_reward,
        args=config,
        train_dataset=arithmetic_dataset("train", 16),
    )
    trainer.train()
    values = [entry["es/js_diversity"] for entry in trainer.state.log_history if "es/js_diversity" in entry]
    assert len(values) == 2 and all(0.0 <= value <= 1.0 for value in values)


# es/param_distance's starting weights


def _weights():
    torch.manual_seed(0)
    return {
        "embed.weight": torch.randn(5, 3),
        "norm.weight": torch.randn(3).to(torch.bfloat16),
        "scale": torch.tensor(2.5, dtype=torch.float16),
        "empty": torch.empty(0, 4),
    }


def test_starting_weights_read_back_bitwise_in_their_dtype(tmp_path):
    weights = _weights()
    stored = StartingWeights.write(weights, tmp_path / "start.safetensors")
    assert list(stored) == list(weights)
    for name, tensor in weights.items():
        assert stored[name].dtype == tensor.dtype
        assert torch.equal(stored[name], tensor)


def test_the_file_is_safetensors(tmp_path):
    weights = _weights()
    StartingWeights.write(weights, tmp_path / "start.safetensors")
    loaded = load_file(tmp_path / "start.safetensors")
    assert all(torch.equal(loaded[name], tensor) for name, tensor in weights.items())


def test_relative_distance_from_stored_weights_equals_the_in_memory_one():
    weights = {"w": torch.tensor([3.0, 4.0]), "b": torch.tensor([1.0, -2.0])}
    master = MasterWeights(weights, sigma=0.1)
    master.tensors["w"].add_(1.0)
    stored = StartingWeights.write(weights)
    assert master.relative_distance(stored) == master.relative_distance(weights)


def test_a_temporary_file_is_removed_with_its_object():
    stored = StartingWeights.write({"w": torch.ones(3)})
    path = stored.path
    assert path.is_file()
    del stored
    gc.collect()
    assert not os.path.exists(path)


def test_an_unknown_name_is_a_key_error(tmp_path):
    stored = StartingWeights.write({"w": torch.ones(3)}, tmp_path / "start.safetensors")
    with pytest.raises(KeyError):
        stored["v"]
