"""A trainer's coverage evaluation on several processes (`trl_es.evaluation.trainer_coverage`): the completions'
entropies are measured where the model's weights are held (gloo processes over 127.0.0.1)."""

import os

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from benchmarks.harness import run_on_processes
from trl_es.core.released_weights import is_released, release
from trl_es.demo.run import DEMO_MODEL
from trl_es.evaluation.coverage import completion_entropy
from trl_es.evaluation.trainer_coverage import entropies_where_held
from trl_es.tasks.arithmetic import arithmetic_dataset

NUM_PROMPTS = 7  # not a multiple of the processes or of the processes holding the weights


def prompts_and_completions() -> tuple[list[list[int]], list[list[list[int]]]]:
    """The eval set's prompts, each with two completions of its own (any tokens: the measure does not sample)."""
    tokenizer = AutoTokenizer.from_pretrained(DEMO_MODEL)
    prompt_ids = [
        tokenizer(p, add_special_tokens=False)["input_ids"] for p in arithmetic_dataset("test", NUM_PROMPTS)["prompt"]
    ]
    return prompt_ids, [[ids[-2:], ids[:4]] for ids in prompt_ids]


def _entropy_worker(rank: int, world: int, release_on: tuple, results) -> None:
    from accelerate import PartialState

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    state = PartialState(cpu=True)  # joins the group the harness made, as a launched trainer's does
    model = AutoModelForCausalLM.from_pretrained(DEMO_MODEL)
    if rank in release_on:
        release(dict(model.named_parameters()))
    prompt_ids, completions = prompts_and_completions()
    indices = list(range(rank, NUM_PROMPTS, world))  # the prompts `measure_trainer` gives this process
    try:
        measure = entropies_where_held(model, indices, state)
        measured = measure([prompt_ids[i] for i in indices], [completions[i] for i in indices])
        error = None
    except RuntimeError as raised:
        measured, error = None, str(raised)
    results[rank] = dict(
        indices=indices,
        measured=measured,
        error=error,
        released=any(is_released(p) for p in model.parameters()),
        holds=sum(p.numel() for p in model.parameters()),
    )


@pytest.fixture(scope="module")
def one_process_entropies() -> list[tuple[float, int]]:
    prompt_ids, completions = prompts_and_completions()
    return completion_entropy(AutoModelForCausalLM.from_pretrained(DEMO_MODEL), prompt_ids, completions)


def assert_entropies_of_each_process_are_those_of_one(results: dict, one_process: list) -> None:
    for result in results.values():
        expected = [one_process[i] for i in result["indices"]]
        assert [count for _, count in result["measured"]] == [count for _, count in expected]
        assert [total for total, _ in result["measured"]] == pytest.approx([total for total, _ in expected], rel=1e-5)


@pytest.mark.slow
def test_processes_that_released_the_weights_get_their_entropies_from_those_that_hold_them(one_process_entropies):
    """Of three processes, the middle one released the model's weights (as a process of a tensor-parallel engine that
    saves no checkpoint does): the other two measure its completions with theirs, and it never holds them."""
    results = run_on_processes(_entropy_worker, 3, (1,))

    assert_entropies_of_each_process_are_those_of_one(results, one_process_entropies)
    assert results[1]["released"] and results[1]["holds"] == 0
    assert not results[0]["released"] and not results[2]["released"]


@pytest.mark.slow
def test_processes_that_all_hold_the_weights_measure_their_own_entropies(one_process_entropies):
    results = run_on_processes(_entropy_worker, 2, ())

    assert_entropies_of_each_process_are_those_of_one(results, one_process_entropies)


@pytest.mark.slow
def test_no_process_holding_the_weights_is_an_error_on_every_process():
    results = run_on_processes(_entropy_worker, 2, (0, 1))

    assert all("no process holds its weights" in result["error"] for result in results.values())
