"""The transformers privates that trl-es uses (through `trl_es.compat.transformers`): a release that renames or
reorders one fails here, with the transformers version in the message."""

import inspect

import pytest
import torch
import transformers
from transformers import Trainer

from trl_es.compat.transformers import (
    TrainerHooks,
    _UploadsIgnoring,
    saved_by_every_saver,
    set_flag_help,
    uploads_ignoring,
    with_patterns,
)

TRANSFORMERS = f"transformers {transformers.__version__}"


def test_trainer_hooks_override_private_methods_the_trainer_still_has():
    for name, parameters in [
        ("_get_train_sampler", ["self", "train_dataset"]),
        ("_save_optimizer_and_scheduler", ["self", "output_dir"]),
        ("_load_optimizer_and_scheduler", ["self", "checkpoint"]),
        ("_load_best_model", ["self"]),
        ("_load_from_checkpoint", ["self", "resume_from_checkpoint", "model"]),
    ]:
        method = getattr(Trainer, name, None)
        assert method is not None, f"{TRANSFORMERS} has no Trainer.{name}; update trl_es.compat.transformers"
        assert list(inspect.signature(method).parameters)[: len(parameters)] == parameters, (
            f"{TRANSFORMERS} changed Trainer.{name}{inspect.signature(method)}; update TrainerHooks"
        )
        assert name in vars(TrainerHooks)


def test_a_checkpoint_saves_the_optimizer_before_its_trainer_state():
    """TrainerHooks.save_extra_state relies on it: a checkpoint with `trainer_state.json` has the extra state too."""
    source = inspect.getsource(Trainer._save_checkpoint)
    hook, state = source.find("self._save_optimizer_and_scheduler("), source.find("self.state.save_to_json(")
    assert -1 < hook < state, f"{TRANSFORMERS} writes trainer_state.json before the optimizer; see TrainerHooks"


def test_resuming_loads_the_optimizer_and_scheduler_through_the_hook():
    assert "self._load_optimizer_and_scheduler(resume_from_checkpoint)" in inspect.getsource(Trainer), (
        f"{TRANSFORMERS} no longer resumes through Trainer._load_optimizer_and_scheduler; update TrainerHooks"
    )


def test_resuming_loads_the_model_weights_through_the_hook():
    assert "self._load_from_checkpoint(resume_from_checkpoint)" in inspect.getsource(Trainer.train), (
        f"{TRANSFORMERS} no longer loads a checkpoint's weights through Trainer._load_from_checkpoint; update "
        "TrainerHooks"
    )


def test_load_best_model_at_end_loads_through_the_hook():
    assert "self._load_best_model()" in inspect.getsource(Trainer), (
        f"{TRANSFORMERS} no longer loads the best model through Trainer._load_best_model; update TrainerHooks"
    )


def test_the_trainer_pushes_upload_through_its_modules_hf_api():
    """uploads_ignoring replaces `transformers.trainer.hf_api` while TrainerHooks pushes: both pushes must still upload
    through it, with `ignore_patterns`, and `_push_from_checkpoint` must still take the checkpoint folder."""
    import transformers.trainer as trainer_module

    assert callable(getattr(trainer_module, "hf_api", None)), f"{TRANSFORMERS} has no transformers.trainer.hf_api"
    for method in (Trainer.push_to_hub, getattr(Trainer, "_push_from_checkpoint", None)):
        assert method is not None, f"{TRANSFORMERS} has no Trainer._push_from_checkpoint; update TrainerHooks"
        source = inspect.getsource(method)
        assert "hf_api().upload_folder(" in source and "ignore_patterns=" in source, (
            f"{TRANSFORMERS} no longer uploads {method.__name__} with hf_api().upload_folder; update uploads_ignoring"
        )
    assert list(inspect.signature(Trainer._push_from_checkpoint).parameters) == ["self", "checkpoint_folder"]
    assert {"push_to_hub", "_push_from_checkpoint"} <= set(vars(TrainerHooks))


def test_uploads_ignoring_adds_its_patterns_to_the_trainers_and_restores_hf_api():
    import transformers.trainer as trainer_module

    shared = trainer_module.hf_api
    with uploads_ignoring(["training_args.bin", "runs/"]):
        api = trainer_module.hf_api()
        assert isinstance(api, _UploadsIgnoring) and api.patterns == ["training_args.bin", "runs/"]
        assert api.endpoint == shared().endpoint  # everything else is transformers' shared HfApi
    assert trainer_module.hf_api is shared
    assert with_patterns(["_*", "checkpoint-*"], ["runs/"]) == ["_*", "checkpoint-*", "runs/"]
    assert with_patterns(None, ["runs/"]) == with_patterns("runs/", ["runs/"]) == ["runs/"]


def test_a_push_leaves_out_the_pickled_arguments_and_the_logs_unless_asked(tmp_path):
    from huggingface_hub.utils import filter_repo_objects

    from trl_es import ESConfig

    events = "runs/Dec02_host/events.out.tfevents.1.host"
    files = ["model.safetensors", "training_args.bin", "checkpoint-2/training_args.bin", events, "last/x.json"]
    for hub_push_logs, pushed in [
        (False, ["model.safetensors", "last/x.json"]),
        (True, ["model.safetensors", events, "last/x.json"]),
    ]:
        hooks = TrainerHooks()
        hooks.args = ESConfig(str(tmp_path), hub_push_logs=hub_push_logs)
        assert list(filter_repo_objects(files, ignore_patterns=hooks.hub_ignore_patterns())) == pushed


def test_save_pretrained_still_asks_the_model_whether_this_rank_writes():
    """`saved_by_every_saver` answers that question for the model; if transformers decides elsewhere, the checkpoints
    of every machine but the first lose their weights again under `save_on_each_node`."""
    from transformers import PreTrainedModel

    assert callable(getattr(PreTrainedModel, "should_save_on_this_rank", None)), (
        f"{TRANSFORMERS} has no PreTrainedModel.should_save_on_this_rank; update saved_by_every_saver"
    )
    source = inspect.getsource(PreTrainedModel.save_pretrained)
    assert "self.should_save_on_this_rank(is_main_process)" in source, (
        f"{TRANSFORMERS}'s save_pretrained no longer asks should_save_on_this_rank; update saved_by_every_saver"
    )


def test_within_saved_by_every_saver_a_saving_process_writes_whatever_its_global_rank(tiny_model_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    with saved_by_every_saver(model, saves=True):
        assert model.should_save_on_this_rank(True) and not model.should_save_on_this_rank(False)
    assert "should_save_on_this_rank" not in vars(model)  # the class's own answer again
    with saved_by_every_saver(model, saves=False):  # a process that does not save changes nothing
        assert "should_save_on_this_rank" not in vars(model)


def test_set_flag_help_replaces_the_help_an_hf_argument_parser_took_from_a_field():
    from transformers import HfArgumentParser, TrainingArguments

    parser = HfArgumentParser(TrainingArguments)
    set_flag_help(parser, "resume_from_checkpoint", "A folder, or `true` for the last checkpoint.")
    shown = " ".join(parser.format_help().split())
    assert "--resume_from_checkpoint RESUME_FROM_CHECKPOINT, --resume-from-checkpoint RESUME_FROM_CHECKPOINT" in shown
    assert "A folder, or `true` for the last checkpoint." in shown, f"{TRANSFORMERS}: the flag kept its field's help"
    with pytest.raises(ValueError, match="no flag for the field 'resume_from'"):
        set_flag_help(parser, "resume_from", "...")


class EpochShuffle(torch.utils.data.Sampler):
    """A shuffle that is a function of the epoch only, as trl-es's `EpochSeededRepeatSampler`."""

    def __init__(self, size: int):
        self.size, self.epoch = size, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        return iter(torch.randperm(self.size, generator=torch.Generator().manual_seed(self.epoch)).tolist())

    def __len__(self) -> int:
        return self.size


class Recorder(torch.nn.Module):
    """A one-weight model that records the examples of each batch it trains on."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.batches = []

    def forward(self, x):
        self.batches.append(x.flatten().tolist())
        return {"loss": (self.weight * x).sum()}


class FirstOfTwoShards(TrainerHooks, Trainer):
    """A Trainer whose train dataloader is process 0's of 2, as `accelerate launch --num_processes 2` prepares it:
    a `BatchSamplerShard` over the `BatchSampler` over the sampler that `wrap_train_sampler` gives."""

    def wrap_train_sampler(self, sampler):
        return EpochShuffle(len(self.train_dataset))

    def get_train_dataloader(self):
        from accelerate.data_loader import prepare_data_loader
        from transformers import default_data_collator

        sampler = self._get_train_sampler(self.train_dataset)
        loader = torch.utils.data.DataLoader(
            self.train_dataset, batch_size=2, sampler=sampler, collate_fn=default_data_collator
        )
        return prepare_data_loader(loader, num_processes=2, process_index=0, put_on_device=False)


def test_the_wrapped_sampler_replays_its_epoch_when_a_sharded_run_resumes_mid_epoch(tmp_path):
    """8 examples, 2 a batch, 2 shards: 2 steps an epoch, so checkpoint-3 is halfway through epoch 1. The skipped
    batch wraps the shard in one more sampler, past the Trainer's and accelerate's `set_epoch`."""
    from transformers import TrainingArguments

    dataset = [{"x": torch.tensor([float(index)])} for index in range(8)]

    def trainer():
        args = TrainingArguments(
            str(tmp_path), per_device_train_batch_size=2, num_train_epochs=3, save_strategy="steps", save_steps=3,
            report_to=[], use_cpu=True, disable_tqdm=True, learning_rate=0.0,
        )  # fmt: skip
        return FirstOfTwoShards(model=Recorder(), args=args, train_dataset=dataset)

    whole = trainer()
    whole.train()
    assert len(whole.model.batches) == 6
    assert whole.model.batches[:2] != whole.model.batches[2:4], "the epochs should be shuffled differently"
    resumed = trainer()
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-3"))
    assert resumed.model.batches == whole.model.batches[3:], f"{TRANSFORMERS}: the resumed epoch lost its shuffle"
