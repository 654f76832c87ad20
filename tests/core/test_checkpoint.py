"""Resume checks what it loads (issue 16, points 3 and 5): a checkpoint whose files do not parse is skipped or refused
by name, saved tensors must match the model, the float32 master survives a change of dtype, and a changed setting is
named (a changed learning_rate says that the saved schedule wins)."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from scripts.fast_es import MOVING, fast_es_config

from trl_es import ESTrainer
from trl_es.core.checkpoint import (
    check_saved_tensors,
    checkpoint_problem,
    last_complete_checkpoint,
    load_es_state,
    save_es_state,
)
from trl_es.core.master import MasterWeights
from trl_es.testing import digit_fraction
from trl_es.trainer.run_settings import changed_run_settings, run_settings


@pytest.fixture(scope="module")
def finished_run(tiny_model_path, tmp_path_factory):
    """A float32 run of two steps with a checkpoint after each: `(output_dir, config overrides)`."""
    from datasets import Dataset

    output_dir = tmp_path_factory.mktemp("finished-run")
    overrides = dict(**MOVING, max_steps=2, save_strategy="steps", save_steps=1)
    dataset = Dataset.from_dict({"prompt": [f"Item {k}:" for k in range(8)]})
    config = fast_es_config(output_dir, **overrides)
    ESTrainer(model=tiny_model_path, reward_funcs=digit_fraction, args=config, train_dataset=dataset).train()
    return output_dir, overrides


@pytest.fixture
def run_copy(finished_run, tmp_path):
    """A copy of the finished run's output_dir, free to damage."""
    output_dir, _ = finished_run
    copy = tmp_path / "run"
    shutil.copytree(output_dir, copy)
    return copy


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


# Every file a resume reads, cut off as a crash or a full disk leaves it; and ES state that parses but is wrong.
DAMAGES = {
    "trainer_state.json": lambda c: _truncate(c / "trainer_state.json"),
    "model.safetensors": lambda c: _truncate(c / "model.safetensors"),
    "es_state.json": lambda c: _truncate(c / "es_state" / "es_state.json"),
    "master.safetensors": lambda c: _truncate(c / "es_state" / "master.safetensors"),
    "reference.safetensors": lambda c: _truncate(c / "es_state" / "reference.safetensors"),
    "scheduler.pt": lambda c: _truncate(c / "scheduler.pt"),
    "holds a list": lambda c: (c / "es_state" / "es_state.json").write_text("[1, 2]"),
}


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


def test_resume_true_with_every_checkpoint_damaged_lists_each_and_why(tiny_model_path, prompts, run_copy):
    DAMAGES["holds a list"](run_copy / "checkpoint-2")
    DAMAGES["scheduler.pt"](run_copy / "checkpoint-1")
    trainer = ESTrainer(
        model=tiny_model_path, reward_funcs=digit_fraction, args=fast_es_config(run_copy), train_dataset=prompts
    )
    with pytest.warns(UserWarning, match="Skipping"), pytest.raises(ValueError) as refused:
        trainer.train(resume_from_checkpoint=True)
    message = str(refused.value)
    assert "No complete checkpoint found" in message
    assert "checkpoint-2: " in message and "holds a list" in message
    assert "checkpoint-1: " in message and "scheduler.pt" in message


@pytest.mark.parametrize("damage", ["es_state.json", "holds a list", "master.safetensors"])
def test_loading_damaged_es_state_names_the_file(run_copy, damage):
    DAMAGES[damage](run_copy / "checkpoint-2")
    with pytest.raises(ValueError, match=r"Cannot resume from .*checkpoint-2: .*es_state"):
        load_es_state(run_copy / "checkpoint-2")


def test_a_named_damaged_checkpoint_is_refused_with_the_reason(tiny_model_path, prompts, finished_run, run_copy):
    DAMAGES["model.safetensors"](run_copy / "checkpoint-2")
    config = fast_es_config(run_copy, **finished_run[1])
    trainer = ESTrainer(model=tiny_model_path, reward_funcs=digit_fraction, args=config, train_dataset=prompts)
    with pytest.raises(ValueError, match=r"Cannot resume from .*checkpoint-2: .*model.safetensors does not parse"):
        trainer.train(resume_from_checkpoint=str(run_copy / "checkpoint-2"))


def test_save_only_model_checkpoints_are_explained_when_none_can_be_resumed(tiny_model_path, prompts, finished_run,
                                                                          tmp_path):  # fmt: skip
    config = fast_es_config(tmp_path / "run", **finished_run[1], save_only_model=True)
    ESTrainer(model=tiny_model_path, reward_funcs=digit_fraction, args=config, train_dataset=prompts).train()
    checkpoint = tmp_path / "run" / "checkpoint-2"
    assert (checkpoint / "model.safetensors").is_file() and not (checkpoint / "es_state").exists()
    trainer = ESTrainer(model=tiny_model_path, reward_funcs=digit_fraction, args=config, train_dataset=prompts)
    with (
        pytest.warns(UserWarning, match="Skipping"),
        pytest.raises(ValueError, match=r"No complete checkpoint found .*checkpoint-2: .*save_only_model=True"),
    ):
        trainer.train(resume_from_checkpoint=True)


def test_a_saved_master_of_a_broadcastable_shape_is_refused():
    master = MasterWeights({"norm.weight": torch.ones(4)}, sigma=0.1)
    with pytest.raises(ValueError, match=r"'norm.weight' is a torch.float32 tensor of shape \(1,\)"):
        master.load_state_dict({"norm.weight": torch.zeros(1)})  # copy_ would broadcast it
    with pytest.raises(ValueError, match="torch.float16"):
        master.load_state_dict({"norm.weight": torch.zeros(4, dtype=torch.float16)})
    assert torch.equal(master.tensors["norm.weight"], torch.ones(4))


def test_saved_tensors_must_have_the_parameters_shapes_and_names(tmp_path):
    parameters = {"a.weight": torch.zeros(2, 3), "b.bias": torch.zeros(3)}
    check_saved_tensors(tmp_path / "master.safetensors", {"a.weight": torch.ones(2, 3)}, parameters)
    with pytest.raises(
        ValueError, match=r"master.safetensors holds 'a.weight' as a torch.float32 tensor of shape \(3,\)"
    ):
        check_saved_tensors(tmp_path / "master.safetensors", {"a.weight": torch.ones(3)}, parameters)
    with pytest.raises(ValueError, match=r"missing \['b.bias'\]"):
        check_saved_tensors(tmp_path / "reference.safetensors", {"a.weight": torch.ones(2, 3)}, parameters, True)


def test_a_float32_checkpoint_resumed_in_bfloat16_keeps_its_float32_master(tiny_model_path, prompts, finished_run):
    output_dir, overrides = finished_run
    checkpoint = output_dir / "checkpoint-2"
    config = fast_es_config(output_dir, **overrides, model_init_kwargs={"dtype": "bfloat16"})
    trainer = ESTrainer(model=tiny_model_path, reward_funcs=digit_fraction, args=config, train_dataset=prompts)
    trainer.train(resume_from_checkpoint=str(checkpoint))  # already at max_steps: loads, makes no step
    saved = load_file(checkpoint / "model.safetensors")
    master = trainer.population.master.tensors
    assert trainer.model.dtype == torch.bfloat16
    rounded = [name for name in master if not torch.equal(saved[name].bfloat16().float(), saved[name])]
    assert rounded, "the run must have float32 weights that bfloat16 rounds"
    assert all(torch.equal(master[name], saved[name]) for name in master)


def test_a_changed_learning_rate_warns_that_the_saved_schedule_wins(tiny_model_path, prompts, finished_run, tmp_path):
    output_dir, overrides = finished_run
    config = fast_es_config(tmp_path / "resumed", **{**overrides, "learning_rate": 0.5})
    trainer = ESTrainer(model=tiny_model_path, reward_funcs=digit_fraction, args=config, train_dataset=prompts)
    with pytest.warns(UserWarning, match=r"learning_rate=0.01, with learning_rate=0.5: .*saved schedule wins"):
        trainer.train(resume_from_checkpoint=str(output_dir / "checkpoint-2"))  # at max_steps: loads, no step
    assert trainer._get_learning_rate() == overrides["learning_rate"]  # what the warning says


@pytest.mark.parametrize(
    ("name", "saved", "current"),
    [
        ("perturbation", "full", "lowrank"),
        ("temperature", 1.0, 0.7),
        ("weight_decay", 0.0, 0.1),
        ("reward_weights", None, [2.0]),
        ("warmup_steps", 0, 5),
        ("lr_scheduler_kwargs", None, {"power": 2.0}),
        ("data_seed", None, 3),
        ("shuffle_dataset", True, False),
        ("disable_dropout", True, False),
        ("use_vllm", False, True),
    ],
)
def test_every_setting_that_changes_the_run_is_compared_on_resume(make_config, name, saved, current):
    saved_settings = json.loads(json.dumps(run_settings(make_config(**{name: saved}))))  # as es_state.json holds them
    changed = changed_run_settings(saved_settings, make_config(**{name: current}))
    assert changed[name] == (saved, current)


def test_es_state_with_a_non_finite_tensor_is_never_written(tmp_path):
    master = {"a.weight": torch.tensor([1.0, float("nan")])}
    with pytest.raises(FloatingPointError, match="'a.weight' has 1 NaN or infinite entries"):
        save_es_state(tmp_path, master, {"a.weight": torch.bfloat16}, {"a.weight": torch.ones(2)}, {"global_step": 1})
    assert not (tmp_path / "es_state").exists()
