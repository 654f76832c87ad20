"""Released model weights (`trl_es.core.released_weights`): what a process of a tensor-parallel engine that saves no
checkpoint lets go of, and gets back from the process that saves (gloo processes over 127.0.0.1)."""

import pytest
import torch

from benchmarks.harness import run_on_processes
from trl_es.backends.population import check_released_masters_saved
from trl_es.core.master import MasterWeights
from trl_es.core.released_weights import is_released, release, released_bytes, restore


class TiedModel(torch.nn.Module):
    """An embedding tied to the output layer, and a float32 norm beside bf16 weights."""

    def __init__(self):
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.embed = torch.nn.Embedding(32, 8, dtype=torch.bfloat16)
        self.embed.weight.data = torch.randn(32, 8, generator=generator).bfloat16()
        self.norm = torch.nn.Parameter(torch.randn(8, generator=generator))
        self.head = torch.nn.Linear(8, 32, bias=False, dtype=torch.bfloat16)
        self.head.weight = self.embed.weight

    def forward(self, ids):
        return self.head(self.embed(ids) * self.norm.bfloat16())


def test_a_released_parameter_keeps_its_object_dtype_and_shape_but_no_data_and_cannot_be_computed_with():
    model = TiedModel()
    parameters = dict(model.named_parameters())
    held = sum(p.numel() * p.element_size() for p in parameters.values())
    objects = {name: id(p) for name, p in parameters.items()}

    release(parameters)
    release(parameters)  # a second release keeps the shapes the first recorded

    assert {name: id(p) for name, p in model.named_parameters()} == objects  # an optimizer's references still hold
    assert model.head.weight is model.embed.weight  # still tied
    assert all(is_released(p) and p.numel() == 0 and p.requires_grad for p in parameters.values())
    assert parameters["embed.weight"].dtype == torch.bfloat16 and parameters["norm"].dtype == torch.float32
    assert released_bytes(parameters) == held
    with pytest.raises(RuntimeError):  # no stale values to compute with
        model(torch.tensor([1, 2]))


def _restore_worker(rank: int, world: int, release_on: tuple, unwanted_on: tuple, results) -> None:
    model = TiedModel()
    if rank != 0:
        with torch.no_grad():  # the centre moved on the process that saves; this one's copy is stale
            model.norm.add_(1.0)
    with torch.no_grad():
        if rank == 0:
            model.embed.weight.mul_(2)
    if rank in release_on:
        release(dict(model.named_parameters()))
    try:
        restore(dict(model.named_parameters()), source=0, device=torch.device("cpu"), wanted=rank not in unwanted_on)
        error = None
    except RuntimeError as raised:
        error = str(raised)
    results[rank] = dict(
        error=error,
        weights={name: p.detach().clone() for name, p in model.named_parameters()},
        released=[name for name, p in model.named_parameters() if is_released(p)],
        tied=model.head.weight is model.embed.weight,
    )


def test_a_process_that_released_its_weights_gets_those_of_the_source_bitwise():
    results = run_on_processes(_restore_worker, 3, (1, 2), ())

    source = results[0]["weights"]
    for rank in (0, 1, 2):
        result = results[rank]
        assert result["error"] is None and result["released"] == [] and result["tied"]
        assert all(torch.equal(result["weights"][name], source[name]) for name in source)
        assert {name: t.dtype for name, t in result["weights"].items()} == {n: t.dtype for n, t in source.items()}


def test_processes_that_released_nothing_keep_their_own_weights():
    results = run_on_processes(_restore_worker, 2, (), ())

    assert results[0]["error"] is None and results[1]["error"] is None
    assert not torch.equal(results[1]["weights"]["norm"], results[0]["weights"]["norm"])  # nothing was sent


def test_a_source_that_released_its_weights_too_is_an_error_on_every_process():
    results = run_on_processes(_restore_worker, 2, (0, 1), ())

    for rank in (0, 1):  # both raise: neither waits for a tensor that never comes
        assert "Process 0" in results[rank]["error"] and "released" in results[rank]["error"]


def test_processes_that_do_not_want_their_released_weights_back_get_nothing_when_none_does():
    results = run_on_processes(_restore_worker, 2, (1,), (1,))

    assert results[1]["error"] is None and sorted(results[1]["released"]) == ["embed.weight", "norm"]


def test_a_process_that_does_not_want_its_weights_back_still_gets_them_when_another_asks():
    results = run_on_processes(_restore_worker, 3, (1, 2), (1,))

    source = results[0]["weights"]
    for rank in (1, 2):  # one broadcast for every process of the group
        assert results[rank]["error"] is None and results[rank]["released"] == []
        assert all(torch.equal(results[rank]["weights"][name], source[name]) for name in source)


@pytest.mark.parametrize("offload", [False, True])
def test_a_master_of_released_weights_is_allocated_for_and_read_from_a_checkpoints_masters(offload):
    """A process that released the model's weights builds its master from the masters of the checkpoint it resumes
    from (as after `load_best_model_at_end`): it allocates each tensor at its full shape, and `load_saved` reads it."""
    model = TiedModel()
    saved = {
        name: torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) for name, p in model.named_parameters()
    }
    release(dict(model.named_parameters()))

    master = MasterWeights(dict(model.named_parameters()), sigma=0.1, offload=offload)
    assert master.shapes == {name: tensor.shape for name, tensor in saved.items()}
    master.load_saved(saved)

    assert all(torch.equal(master.stored(name), saved[name]) for name in saved)
    assert all(is_released(p) for p in model.parameters())  # the master holds copies, the model still nothing


def test_building_a_population_from_released_weights_without_their_saved_masters_is_refused():
    model = TiedModel()
    parameters = dict(model.named_parameters())
    release({"norm": parameters["norm"]})

    with pytest.raises(RuntimeError, match="'norm'.*released on this process.*restore"):
        check_released_masters_saved(parameters, {"embed.weight": torch.zeros(32, 8)})
    check_released_masters_saved(parameters, {"norm": torch.zeros(8)})  # its master is in the checkpoint
