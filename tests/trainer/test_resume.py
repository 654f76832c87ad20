"""Resuming an ES run (`trl_es.trainer.resume`): checkpoints are Hugging Face format, resume continues the same run
bit for bit, and failures lose nothing. Resume checks what it loads (issue 16, points 3 and 5): a checkpoint whose
files do not parse is skipped or refused by name, the float32 master survives a change of dtype, and a changed setting
is named (a changed learning_rate says that the saved schedule wins)."""

import json
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from scripts.damaged_checkpoints import DAMAGES
from scripts.fast_es import MOVING, fast_es_config
from transformers import AutoModelForCausalLM

from trl_es import ESTrainer
from trl_es.core.checkpoint import last_complete_checkpoint
from trl_es.testing import digit_fraction
from trl_es.trainer.released_model import load_fixed_weights
from trl_es.trainer.resume import ResumedRun, holds_every_master


def resumable_config(make_config, **overrides):
    return make_config(**{**MOVING, "max_steps": 4, "save_strategy": "steps", "save_steps": 2, **overrides})


def weights(model):
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def assert_bitwise_equal(first, second):
    assert first.keys() == second.keys()
    different = [name for name in first if not torch.equal(first[name], second[name])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[:3]}"


# 8 prompts in batches of 4: checkpoint-2 ends an epoch, checkpoint-3 is mid-epoch.
@pytest.mark.parametrize(("dtype", "resume_step"), [("float32", 3), ("bfloat16", 2)])
def test_resume_continues_the_run_bit_for_bit(tiny_model_path, prompts, make_config, dtype, resume_step):
    config = resumable_config(make_config, save_steps=resume_step, model_init_kwargs={"dtype": dtype})
    uninterrupted = ESTrainer(model=tiny_model_path, reward_funcs=digit_fraction, args=config, train_dataset=prompts)
    uninterrupted.train()

    resumed = ESTrainer(model=tiny_model_path, reward_funcs=digit_fraction, args=config, train_dataset=prompts)
    resumed.train(resume_from_checkpoint=str(Path(config.output_dir) / f"checkpoint-{resume_step}"))

    assert resumed.state.global_step == 4
    assert_bitwise_equal(weights(uninterrupted.model), weights(resumed.model))
    assert_bitwise_equal(uninterrupted.population.master.tensors, resumed.population.master.tensors)
    first_log = [h for h in uninterrupted.state.log_history if h.get("step") == 4 and "reward" in h][0]
    resumed_log = [h for h in resumed.state.log_history if h.get("step") == 4 and "reward" in h][0]
    assert first_log["reward"] == resumed_log["reward"]
    assert first_log["es/param_distance"] == resumed_log["es/param_distance"]  # measured from the run's start


def test_a_released_population_of_a_resumed_run_is_built_again_from_the_model_not_from_its_checkpoint(
    tiny_model_path, prompts, make_config
):
    config = resumable_config(make_config, model_init_kwargs={"dtype": "bfloat16"})
    ESTrainer(model=tiny_model_path, reward_funcs=digit_fraction, args=config, train_dataset=prompts).train()
    resumed = ESTrainer(model=tiny_model_path, reward_funcs=digit_fraction, args=config, train_dataset=prompts)
    resumed.train(resume_from_checkpoint=str(Path(config.output_dir) / "checkpoint-2"))

    resumed.release_population()  # as a SequentialTrainer does when it shuts the stage's engine down

    # A bfloat16 model: the checkpoint's float32 masters of step 2 differ from the weights of step 4.
    model = dict(resumed.model.named_parameters())
    assert all(torch.equal(tensor, model[name].float()) for name, tensor in resumed.population.master.tensors.items())


@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
def test_resume_continues_the_es_optimizer_state_bit_for_bit(tiny_model_path, prompts, make_config, optimizer):
    config = resumable_config(make_config, save_steps=3, es_optimizer=optimizer, learning_rate=1e-3)
    uninterrupted = ESTrainer(model=tiny_model_path, reward_funcs=digit_fraction, args=config, train_dataset=prompts)
    uninterrupted.train()
    saved = load_file(Path(config.output_dir) / "checkpoint-3" / "es_state" / "optimizer.safetensors")
    assert saved.keys() == uninterrupted.population.master.optimizer.state_dict().keys() != set()

    resumed = ESTrainer(model=tiny_model_path, reward_funcs=digit_fraction, args=config, train_dataset=prompts)
    resumed.train(resume_from_checkpoint=str(Path(config.output_dir) / "checkpoint-3"))

    assert_bitwise_equal(weights(uninterrupted.model), weights(resumed.model))
    first, second = uninterrupted.population.master.optimizer, resumed.population.master.optimizer
    assert first.updates == second.updates == 4
    assert_bitwise_equal(first.state_dict(), second.state_dict())
    plain = resumable_config(make_config, learning_rate=1e-3, output_dir=Path(config.output_dir).parent / "plain")
    sgd = ESTrainer(model=tiny_model_path, reward_funcs=digit_fraction, args=plain, train_dataset=prompts)
    sgd.train()
    assert not torch.equal(*(dict(t.model.named_parameters())["lm_head.weight"] for t in (sgd, resumed)))


def test_resuming_with_another_es_optimizer_is_refused(tiny_model_path, prompts, make_config):
    config = resumable_config(make_config, max_steps=2, es_optimizer="momentum")
    ESTrainer(model=tiny_model_path, reward_funcs=digit_fraction, args=config, train_dataset=prompts).train()
    changed = resumable_config(make_config, max_steps=3, es_optimizer="adam")
    resumed = ESTrainer(model=tiny_model_path, reward_funcs=digit_fraction, args=changed, train_dataset=prompts)
    with pytest.warns(UserWarning, match="written with es_optimizer='momentum'"):
        with pytest.raises(
            ValueError, match="its optimizer state does not apply. Resume with es_optimizer='momentum'"
        ):
            resumed.train(resume_from_checkpoint=True)


def test_checkpoint_is_hugging_face_format_with_es_state_without_pickle(tiny_model_path, prompts, make_config):
    config = resumable_config(make_config, max_steps=2, model_init_kwargs={"dtype": "bfloat16"})
    ESTrainer(model=tiny_model_path, reward_funcs=digit_fraction, args=config, train_dataset=prompts).train()
    checkpoint = Path(config.output_dir) / "checkpoint-2"
    model = AutoModelForCausalLM.from_pretrained(checkpoint)
    assert model.dtype == torch.bfloat16
    master = load_file(checkpoint / "es_state" / "master.safetensors")
    assert master and all(t.dtype == torch.float32 for t in master.values())
    for name, param in model.named_parameters():
        assert torch.equal(master[name].to(torch.bfloat16), param.detach()), name  # saved weights = cast(master)
    metadata = json.loads((checkpoint / "es_state" / "es_state.json").read_text())
    assert metadata["global_step"] == 2 and metadata["population_size"] == 4


@pytest.mark.parametrize("temporary_files", ["beside the checkpoints", "on another filesystem"])
def test_the_checkpoints_of_a_run_share_one_file_of_its_starting_weights_and_a_resume_writing_one_again_spoils_none(
    tiny_model_path, prompts, make_config, monkeypatch, request, tmp_path, temporary_files
):
    """The run keeps its starting weights in a temporary file (`TMPDIR`): every checkpoint links it, or, where
    `TMPDIR` is on another filesystem (here tmpfs), the first checkpoint's copy. A resumed run links its
    checkpoint's."""
    folder = str(tmp_path)
    if temporary_files == "on another filesystem":
        folder = tempfile.mkdtemp(dir="/dev/shm")
        request.addfinalizer(lambda: shutil.rmtree(folder, ignore_errors=True))
    monkeypatch.setattr(tempfile, "tempdir", folder)
    config = resumable_config(make_config, model_init_kwargs={"dtype": "bfloat16"})
    ESTrainer(model=tiny_model_path, reward_funcs=digit_fraction, args=config, train_dataset=prompts).train()
    references = [
        Path(config.output_dir) / f"checkpoint-{step}" / "es_state" / "reference.safetensors" for step in (2, 4)
    ]
    assert references[0].stat().st_ino == references[1].stat().st_ino  # written once at most: linked, not rewritten
    start = weights(AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.bfloat16))

    resumed = ESTrainer(model=tiny_model_path, reward_funcs=digit_fraction, args=config, train_dataset=prompts)
    resumed.train(resume_from_checkpoint=str(references[0].parents[1]))  # writes checkpoint-4 again
    assert references[0].stat().st_ino == references[1].stat().st_ino
    for reference in references:
        assert_bitwise_equal(load_file(reference), start)


def test_resume_true_skips_a_half_written_checkpoint(tiny_model_path, prompts, make_config):
    config = resumable_config(make_config, max_steps=2, save_steps=1)
    ESTrainer(model=tiny_model_path, reward_funcs=digit_fraction, args=config, train_dataset=prompts).train()
    half_written = Path(config.output_dir) / "checkpoint-2"
    uninterrupted = load_file(half_written / "model.safetensors")
    state = half_written / "trainer_state.json"
    state.write_text(state.read_text()[:100])  # as if the process died (or the disk filled) while writing it
    calls = []

    def counted(completions, **kwargs):
        calls.append(len(completions))
        return digit_fraction(completions)

    resumed = ESTrainer(model=tiny_model_path, reward_funcs=counted, args=config, train_dataset=prompts)
    with pytest.warns(UserWarning, match=r"Skipping .*checkpoint-2, .*trainer_state.json does not parse"):
        resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 2 and len(calls) == config.population_size  # one step, from checkpoint-1
    assert_bitwise_equal(uninterrupted, {name: p.detach() for name, p in resumed.model.named_parameters()})
    assert json.loads(state.read_text())["global_step"] == 2  # rewritten whole


def test_a_crash_mid_training_keeps_the_last_checkpoint_and_the_centre_weights(tiny_model_path, prompts, make_config):
    config = resumable_config(make_config)
    calls = {"count": 0}

    def fails_in_step_three(completions, **kwargs):
        calls["count"] += 1
        if calls["count"] == 2 * config.population_size + 2:  # the second member of step 3
            raise RuntimeError("reward server went away")
        return digit_fraction(completions)

    trainer = ESTrainer(model=tiny_model_path, reward_funcs=fails_in_step_three, args=config, train_dataset=prompts)
    with pytest.raises(RuntimeError, match="reward server went away"):
        trainer.train()
    # The model holds the centre (the master), not the member that was being evaluated.
    for name, param in trainer.model.named_parameters():
        assert torch.equal(param.detach(), trainer.population.master.tensors[name]), name
    assert last_complete_checkpoint(config.output_dir) == str(Path(config.output_dir) / "checkpoint-2")

    resumed = ESTrainer(model=tiny_model_path, reward_funcs=digit_fraction, args=config, train_dataset=prompts)
    resumed.train(resume_from_checkpoint=True)
    uninterrupted_config = resumable_config(make_config, output_dir=str(Path(config.output_dir).parent / "clean"))
    uninterrupted = ESTrainer(
        model=tiny_model_path, reward_funcs=digit_fraction, args=uninterrupted_config, train_dataset=prompts
    )
    uninterrupted.train()
    assert_bitwise_equal(weights(uninterrupted.model), weights(resumed.model))


def test_resume_true_without_checkpoints_says_so(tiny_model_path, prompts, make_config):
    trainer = ESTrainer(model=tiny_model_path, reward_funcs=digit_fraction, args=make_config(), train_dataset=prompts)
    with pytest.raises(ValueError, match="No complete checkpoint found"):
        trainer.train(resume_from_checkpoint=True)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("sigma", 0.07),
        ("population_size", 2),
        ("fitness_shaping", "centered_rank"),
        ("seed", 7),
        ("temperature", 0.5),
        ("weight_decay", 0.01),
        ("perturbation", "lowrank"),
    ],
)
def test_resuming_with_another_run_setting_names_it(tiny_model_path, prompts, make_config, name, value):
    config = resumable_config(make_config, max_steps=2)
    ESTrainer(model=tiny_model_path, reward_funcs=digit_fraction, args=config, train_dataset=prompts).train()
    changed = resumable_config(make_config, max_steps=3, **{name: value})
    resumed = ESTrainer(model=tiny_model_path, reward_funcs=digit_fraction, args=changed, train_dataset=prompts)
    with pytest.warns(UserWarning, match=rf"written with {name}=.*Resume with {name}="):
        resumed.train(resume_from_checkpoint=str(Path(config.output_dir) / "checkpoint-2"))


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


def test_a_process_that_did_not_load_a_float32_checkpoint_reads_every_master_from_its_model_files(
    tiny_model_path, finished_run
):
    """A process of a tensor-parallel engine that keeps no model resumes without loading the checkpoint's weights: a
    float32 checkpoint's weights are its masters, read one at a time as the process asks for its share."""
    output_dir, overrides = finished_run
    checkpoint = str(output_dir / "checkpoint-2")
    starting = dict(AutoModelForCausalLM.from_pretrained(tiny_model_path).named_parameters())  # not the checkpoint's
    config = fast_es_config(output_dir, **overrides)
    saved = load_file(Path(checkpoint) / "model.safetensors")

    assert holds_every_master(checkpoint, starting)
    unloaded = ResumedRun.load(checkpoint, starting, config, ["digit_fraction"], model_loaded=False)
    loaded = ResumedRun.load(checkpoint, starting, config, ["digit_fraction"])

    assert set(unloaded.lossy_masters) == set(starting) and not loaded.lossy_masters  # a loaded model holds them
    assert all(torch.equal(unloaded.lossy_masters[name], saved[name]) for name in starting)
    assert any(not torch.equal(saved[name], p) for name, p in starting.items())  # the run moved the weights


def test_a_process_that_does_not_load_a_checkpoint_still_loads_its_weights_that_do_not_evolve(
    tiny_model_path, finished_run
):
    output_dir, _ = finished_run
    checkpoint = output_dir / "checkpoint-2"
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    model.model.norm.weight.requires_grad_(False)  # a weight the run keeps fixed
    starting = weights(model)
    saved = load_file(checkpoint / "model.safetensors")

    load_fixed_weights(model, str(checkpoint))

    after = weights(model)
    assert torch.equal(after["model.norm.weight"], saved["model.norm.weight"])
    assert not torch.equal(saved["model.norm.weight"], starting["model.norm.weight"])  # the run moved it
    assert all(torch.equal(after[name], starting[name]) for name in starting if name != "model.norm.weight")


def test_a_checkpoint_whose_files_hold_no_float32_master_of_a_weight_must_be_loaded(finished_run, tmp_path):
    output_dir, _ = finished_run
    checkpoint = tmp_path / "checkpoint-2"
    shutil.copytree(output_dir / "checkpoint-2", checkpoint)
    saved = load_file(checkpoint / "model.safetensors")
    save_file({name: tensor.bfloat16() for name, tensor in saved.items()}, checkpoint / "model.safetensors")
    parameters = {name: torch.zeros(tensor.shape) for name, tensor in saved.items()}

    assert not holds_every_master(str(checkpoint), parameters)  # its ES state keeps no master of float32 weights


def test_a_changed_learning_rate_warns_that_the_saved_schedule_wins(tiny_model_path, prompts, finished_run, tmp_path):
    output_dir, overrides = finished_run
    config = fast_es_config(tmp_path / "resumed", **{**overrides, "learning_rate": 0.5})
    trainer = ESTrainer(model=tiny_model_path, reward_funcs=digit_fraction, args=config, train_dataset=prompts)
    with pytest.warns(UserWarning, match=r"learning_rate=0.01, with learning_rate=0.5: .*saved schedule wins"):
        trainer.train(resume_from_checkpoint=str(output_dir / "checkpoint-2"))  # at max_steps: loads, no step
    assert trainer._get_learning_rate() == overrides["learning_rate"]  # what the warning says
