"""ES state in a checkpoint (`trl_es.core.checkpoint`): a checkpoint whose files do not parse is not resumable and
the file is named, damaged checkpoints are skipped naming each, saved tensors must have the parameters' shapes and
names, and ES state with a non-finite tensor is never written."""

import json

import pytest
import torch
from scripts.damaged_checkpoints import DAMAGES

from trl_es.core.checkpoint import (
    check_saved_tensors,
    checkpoint_problem,
    es_state_files,
    last_complete_checkpoint,
    load_es_state,
    save_es_state,
)
from trl_es.core.tensor_files import TensorStream


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_checkpoint_with_a_file_that_does_not_parse_is_not_resumable_and_the_file_is_named(run_copy, damage):
    checkpoint = run_copy / "checkpoint-2"
    assert checkpoint_problem(checkpoint) is None
    DAMAGES[damage](checkpoint)
    assert damage in checkpoint_problem(checkpoint)


def test_resume_true_skips_damaged_checkpoints_naming_each(run_copy):
    DAMAGES["trainer_state.json"](run_copy / "checkpoint-2")
    with pytest.warns(UserWarning, match=r"Skipping .*checkpoint-2.*trainer_state.json does not parse"):
        assert last_complete_checkpoint(run_copy) == str(run_copy / "checkpoint-1")
    DAMAGES["master.safetensors"](run_copy / "checkpoint-1")
    with pytest.warns(UserWarning) as skipped:
        assert last_complete_checkpoint(run_copy) is None
    assert [str(warning.message).split(",")[0] for warning in skipped] == [
        f"Skipping {run_copy / 'checkpoint-2'}",
        f"Skipping {run_copy / 'checkpoint-1'}",
    ]
    assert "trainer_state.json" in str(skipped[0].message) and "master.safetensors" in str(skipped[1].message)


@pytest.mark.parametrize("damage", ["es_state.json", "holds a list", "master.safetensors"])
def test_loading_damaged_es_state_names_the_file(run_copy, damage):
    DAMAGES[damage](run_copy / "checkpoint-2")
    with pytest.raises(ValueError, match=r"Cannot resume from .*checkpoint-2: .*es_state"):
        load_es_state(run_copy / "checkpoint-2")


def test_a_checkpoint_of_the_format_with_one_master_file_is_still_resumable(run_copy):
    # Format 1 (before 2026-12-07) listed no files: es_state/ held one master file and one optimizer file.
    state_dir = run_copy / "checkpoint-2" / "es_state"
    metadata = json.loads((state_dir / "es_state.json").read_text())
    assert (metadata["format_version"], metadata["master_files"]) == (2, ["master.safetensors"])
    del metadata["master_files"], metadata["optimizer_files"]
    (state_dir / "es_state.json").write_text(json.dumps({**metadata, "format_version": 1}))
    assert checkpoint_problem(run_copy / "checkpoint-2") is None
    files = ([state_dir / "master.safetensors"], [state_dir / "optimizer.safetensors"])
    assert es_state_files(run_copy / "checkpoint-2") == files
    assert load_es_state(run_copy / "checkpoint-2")[2]["global_step"] == 2


def test_saved_tensors_must_have_the_parameters_shapes_and_names(tmp_path):
    parameters = {"a.weight": torch.zeros(2, 3), "b.bias": torch.zeros(3)}
    check_saved_tensors(tmp_path / "master.safetensors", {"a.weight": torch.ones(2, 3)}, parameters)
    with pytest.raises(
        ValueError, match=r"master.safetensors holds 'a.weight' as a torch.float32 tensor of shape \(3,\)"
    ):
        check_saved_tensors(tmp_path / "master.safetensors", {"a.weight": torch.ones(3)}, parameters)
    with pytest.raises(ValueError, match=r"missing \['b.bias'\]"):
        check_saved_tensors(tmp_path / "reference.safetensors", {"a.weight": torch.ones(2, 3)}, parameters, True)


def test_es_state_with_a_non_finite_tensor_is_never_written(tmp_path):
    master = {"a.weight": torch.ones(2), "b.weight": torch.tensor([1.0, float("nan")]), "c.weight": torch.ones(2)}
    streamed = TensorStream.of(master)
    with pytest.raises(FloatingPointError, match="'b.weight' has 1 NaN or infinite entries"):
        save_es_state(tmp_path, streamed, {"a.weight": torch.ones(2)}, {"global_step": 1})
    assert not (tmp_path / "es_state").exists()
    assert list(streamed.tensors) == []  # drained: other processes may be sending the rest
