"""SequentialTrainer: run ES and GRPO stages one after the other, each from the previous stage's checkpoint.

The paper's best Pass@32 came from ES followed by GRPO (arXiv 2608.27351). Each stage is a plain ESTrainer or
GRPOTrainer run in `output_dir/stage-<i>-<es|grpo>`; its final model is saved in `final/` of that folder, and the next
stage loads it from there, so every hand-over is an ordinary Hugging Face checkpoint.
"""

from __future__ import annotations

import gc
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate.state import PartialState
from datasets import Dataset, load_from_disk
from trl import GRPOConfig, GRPOTrainer

from ..compat.accelerate import reset_accelerator_state
from ..compat.deepspeed import release_process_groups
from ..core.checkpoint import last_complete_checkpoint
from ..core.noise import derive_seed
from ..trainer.es_config import ESConfig
from ..trainer.es_trainer import ESTrainer
from ..trainer.model_card import (
    generate_sequential_model_card,
    hub_id_or_none,
    reward_function_names,
    stage_hyperparameters,
    stage_papers,
    stage_summary,
)
from ..trainer.output_lock import hold_output_dir
from ..trainer.preemption import stop_on_preemption
from ..trainer.vllm_engine import release_vllm_engine
from .stage_configs import training_config

FINAL_DIR = "final"
DATASET_DIR = "dataset"


@dataclass
class Stage:
    """One stage: its config (an [`ESConfig`] runs ES, a [`~trl.GRPOConfig`] runs GRPO) and, optionally, what it
    uses instead of the SequentialTrainer's.

    Args:
        args ([`ESConfig`] or [`~trl.GRPOConfig`]): The stage's config; its type picks the trainer.
        train_dataset, eval_dataset (`datasets.Dataset`, *optional*): The stage's own datasets.
        reward_funcs (*optional*): The stage's own reward functions.
        build_dataset (`Callable[[str, Path], Dataset]`, *optional*): Builds the stage's training set when the stage
            starts, from the model it starts from (a path) into the stage's folder. The set is saved there and reused
            when an interrupted stage resumes, so a resumed stage trains on the same data.
        name (`str`, *optional*): A label for the stage's folder, `stage-<i>-<name>-<es|grpo>`.
        kl_probe_prompts (`list`, *optional*): For an ES stage with `kl_anchor_beta`, the prompts of its KL anchor's
            probe (see [`ESTrainer`]); ignored by GRPO stages, whose `beta` reads their own completions.
    """

    args: ESConfig | GRPOConfig
    train_dataset: Any = None
    eval_dataset: Any = None
    reward_funcs: Any = None
    build_dataset: Callable[[str, Path], Dataset] | None = None
    name: str | None = None
    kl_probe_prompts: list | None = None

    @property
    def method(self) -> str:
        return "es" if isinstance(self.args, ESConfig) else "grpo"


class SequentialTrainer:
    r"""
    Runs ES and GRPO stages in sequence (ES→GRPO, GRPO→ES, or any order and length).

    Args:
        model (`str`):
            Path or Hub id of the starting model.
        stages (`list` of [`ESConfig`], [`~trl.GRPOConfig`] or [`Stage`]):
            The stages in order. The type of each config picks the trainer. A stage's `output_dir` is replaced by
            `output_dir/stage-<i>-<es|grpo>`.
        output_dir (`str`):
            Folder of the whole run.
        reward_funcs, train_dataset, eval_dataset, processing_class, reward_processing_classes, callbacks:
            As for [`ESTrainer`] and [`~trl.GRPOTrainer`]; passed to every stage (a [`Stage`] may override the
            datasets).

    Interrupted runs resume: a stage whose `final/` model exists is skipped, and the running stage resumes from its
    last complete checkpoint. Every ES stage after the first draws its own noise (`ESConfig.noise_seed`, derived from
    the stage's `seed` and its index, unless set): a stage's steps count from 0 again, and would otherwise replay the
    members of an earlier ES stage. SIGTERM or SIGUSR1 stops a stage, ES or GRPO, after its current step with a
    checkpoint (see [`ESTrainer`]), and `train()` again resumes it; a second run on the same `output_dir` is refused
    while one trains. Between stages the trainer is dropped and its resources released (a colocated vLLM engine, the
    Accelerate and DeepSpeed state) before the next one starts, so several colocate stages run in one process.
    """

    def __init__(
        self,
        model: str,
        stages: list[ESConfig | GRPOConfig | Stage],
        output_dir: str,
        reward_funcs=None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        reward_processing_classes=None,
        callbacks=None,
    ):
        if not isinstance(model, (str, Path)):
            raise TypeError(
                "SequentialTrainer takes the starting model as a path or Hub id, because every stage loads its model "
                f"from a checkpoint; got {type(model).__name__}. Save the model with `save_pretrained` first."
            )
        if not stages:
            raise ValueError("stages is empty: give at least one ESConfig or GRPOConfig.")
        self.model = str(model)
        self.stages = [stage if isinstance(stage, Stage) else Stage(stage) for stage in stages]
        for index, stage in enumerate(self.stages):
            if not isinstance(stage.args, GRPOConfig):
                raise TypeError(f"Stage {index} must be an ESConfig or a GRPOConfig, got {type(stage.args).__name__}.")
        self.output_dir = Path(output_dir)
        self.shared = dict(
            reward_funcs=reward_funcs,
            processing_class=processing_class,
            reward_processing_classes=reward_processing_classes,
            callbacks=callbacks,
        )
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset

    def stage_dir(self, index: int) -> Path:
        stage = self.stages[index]
        label = f"{stage.name}-{stage.method}" if stage.name else stage.method
        return self.output_dir / f"stage-{index}-{label}"

    def final_model(self, index: int) -> Path:
        return self.stage_dir(index) / FINAL_DIR

    def train(self) -> Path:
        """Run the stages that have not finished; returns the folder of the final model, with its model card. Holds
        `output_dir`'s lock meanwhile (a second run on the same folder is refused)."""
        model = self.model
        with hold_output_dir(self.output_dir):
            for index, stage in enumerate(self.stages):
                final = self.final_model(index)
                if not (final / "config.json").is_file():
                    self._run_stage(index, stage, model)
                model = str(final)
            self.create_model_card()
        return Path(model)

    def create_model_card(
        self, dataset_name: str | None = None, hub_model_id: str | None = None, stage_folders: list[str] | None = None
    ) -> None:
        """Write `README.md` in the final model's folder: the base model, the dataset (`dataset_name`, a Hub id),
        every stage with its method, reward functions and hyperparameters, and the papers."""
        base_model = hub_id_or_none(self.model)  # a local path stays private
        stages = [
            {
                "method": f"{s.method.upper()} ({s.name})" if s.name else s.method.upper(),
                "summary": stage_summary(s.args),
                "hyperparameters": stage_hyperparameters(s.args),
                "reward_functions": reward_function_names(s.reward_funcs or self.shared["reward_funcs"]),
                "papers": stage_papers(s.args),
            }
            for s in self.stages
        ]
        card = generate_sequential_model_card(
            base_model=base_model,
            model_name=self.output_dir.name,
            hub_model_id=hub_model_id,
            dataset_name=dataset_name,
            stages=stages,
            tags=["trl", "trl-es", *sorted({s.method for s in self.stages})],
            stage_folders=stage_folders,
        )
        card.save(self.final_model(len(self.stages) - 1) / "README.md")

    def push_to_hub(
        self,
        repo_id: str,
        include_stages: bool = False,
        private: bool | None = None,
        *,
        revision: str | None = None,
        commit_message: str | None = None,
        token: str | None = None,
        dataset_name: str | None = None,
    ):
        """Push the final model and its card to `repo_id` in one commit; with `include_stages`, every stage's final
        model too, in the stage's folder (`stage-<i>-<method>/`). Call it from one process, after `train`.

        Args:
            repo_id (`str`): `name` (in the token's namespace) or `namespace/name`; created when missing.
            include_stages (`bool`): Also push the model of every stage.
            private (`bool`, *optional*): Visibility of a repository this creates.
            revision (`str`, *optional*): The branch to commit to (default `main`); created from `main` when missing.
            commit_message (`str`, *optional*): Default: the stages, e.g. `"ES → GRPO with trl-es: final model"`.
            token (`str`, *optional*): Default: the saved token or `HF_TOKEN`.
            dataset_name (`str`, *optional*): The training set's Hub id, named in the card.

        Returns:
            [`~huggingface_hub.CommitInfo`]: the commit (its `oid`, `commit_url`).
        """
        from huggingface_hub import CommitOperationAdd, HfApi

        last = len(self.stages) - 1
        if not (self.final_model(last) / "config.json").is_file():
            raise FileNotFoundError(
                f"No final model in {self.final_model(last)}: run `train()` before `push_to_hub`, with the same "
                "output_dir."
            )
        api = HfApi(token=token)
        repo_id = api.create_repo(repo_id, private=private, exist_ok=True).repo_id
        if revision is not None and not revision.startswith("refs/pr/"):
            api.create_branch(repo_id, branch=revision, exist_ok=True)  # the Hub refuses commits to a missing branch
        stage_folders = [self.stage_dir(index).name for index in range(len(self.stages))] if include_stages else None
        folders = {"": self.final_model(last)}
        for index, name in enumerate(stage_folders or []):
            folders[f"{name}/"] = self.final_model(index)
        self.create_model_card(dataset_name=dataset_name, hub_model_id=repo_id, stage_folders=stage_folders)
        operations = [
            CommitOperationAdd(path_in_repo=prefix + path.relative_to(folder).as_posix(), path_or_fileobj=str(path))
            for prefix, folder in folders.items()
            for path in sorted(folder.rglob("*"))
            if path.is_file()
            and not any(part.startswith(".") for part in path.relative_to(folder).parts)
            and not (prefix and path.name == "README.md")  # the card is the repository's, at its root
            # A stage's pickled config: its local paths, and a GRPO stage's hub_token; the card lists the settings.
            and path.name != "training_args.bin"
        ]
        methods = " → ".join(stage.method.upper() for stage in self.stages)
        pushed = "final model and every stage's" if include_stages else "final model"
        return api.create_commit(
            repo_id,
            operations,
            commit_message=commit_message or f"{methods} with trl-es: {pushed}",
            revision=revision,
        )

    def _run_stage(self, index: int, stage: Stage, model: str) -> None:
        args = training_config(stage.args)
        args.output_dir = str(self.stage_dir(index))
        if stage.method == "es" and index > 0 and args.noise_seed is None:
            args.noise_seed = derive_seed(args.seed, "stage", index)  # not a replay of an earlier ES stage's noise
        trainer_class = ESTrainer if stage.method == "es" else GRPOTrainer
        shared = dict(self.shared)
        if stage.reward_funcs is not None:
            shared["reward_funcs"] = stage.reward_funcs
        if stage.method == "es" and stage.kl_probe_prompts is not None:
            shared["kl_probe_prompts"] = stage.kl_probe_prompts
        trainer = trainer_class(
            model=model,
            args=args,
            train_dataset=self._train_dataset(index, stage, model),
            eval_dataset=stage.eval_dataset if stage.eval_dataset is not None else self.eval_dataset,
            **shared,
        )
        if stage.method == "es":
            trainer.train(resume_from_checkpoint=self._resume_point(index, stage))
        else:  # ESTrainer.train stops on preemption itself
            with stop_on_preemption(trainer):
                trainer.train(resume_from_checkpoint=self._resume_point(index, stage))
        self._save_final_model(trainer, self.final_model(index))
        trainer.accelerator.free_memory()  # drops the prepared model and optimizer, destroys a DeepSpeed engine
        release_process_groups()  # DeepSpeed's, which would hold them past the run's `destroy_process_group`
        release_vllm_engine(trainer)  # now, not whenever the trainer is collected: the next stage may start its own
        reset_accelerator_state()  # the next stage's Accelerator takes its own DeepSpeed plugin and precision
        del trainer
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _train_dataset(self, index: int, stage: Stage, model: str):
        """The stage's training set: built at its start when it has a `build_dataset` (by the main process, saved in
        the stage folder before training, and read back by every process and by a resumed stage)."""
        if stage.build_dataset is None:
            return stage.train_dataset if stage.train_dataset is not None else self.train_dataset
        saved = self.stage_dir(index) / DATASET_DIR
        state = PartialState()
        if state.is_main_process and not saved.is_dir():
            building = saved.with_name(DATASET_DIR + ".building")
            shutil.rmtree(building, ignore_errors=True)
            stage.build_dataset(model, self.stage_dir(index)).save_to_disk(str(building))
            building.rename(saved)  # a crash while building leaves no half-written dataset behind
        state.wait_for_everyone()
        return load_from_disk(str(saved))

    @staticmethod
    def _save_final_model(trainer, final: Path) -> None:
        """Write the stage's model and tokenizer to `final/` all at once: into a sibling folder first, renamed when
        complete, so that a crash mid-save leaves no `final/` that counts the stage as finished (issue 27: a `final/`
        with its config but no weights could not be resumed)."""
        partial = final.with_name(final.name + ".partial")
        if trainer.accelerator.is_main_process:
            shutil.rmtree(partial, ignore_errors=True)  # a crash's leftover
        trainer.accelerator.wait_for_everyone()
        trainer.save_model(str(partial))
        if trainer.accelerator.is_main_process:
            trainer.processing_class.save_pretrained(str(partial))
            shutil.rmtree(final, ignore_errors=True)  # what an older version left half-written
            os.replace(partial, final)
        trainer.accelerator.wait_for_everyone()

    def _resume_point(self, index: int, stage: Stage) -> str | None:
        if stage.method == "es":
            return last_complete_checkpoint(self.stage_dir(index))
        from transformers.trainer_utils import get_last_checkpoint

        return get_last_checkpoint(str(self.stage_dir(index))) if self.stage_dir(index).is_dir() else None
