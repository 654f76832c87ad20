"""SequentialTrainer hands Hugging Face checkpoints between ES and GRPO stages, and resumes interrupted runs."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from scripts.fast_es import MOVING, fast_es_config, fast_grpo_config
from transformers import TrainerCallback

from trl_es.sequential import SequentialTrainer, Stage
from trl_es.toy_task import digit_fraction, digit_prompts


class RecordStartWeights(TrainerCallback):
    def __init__(self):
        self.starts = []

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.starts.append({name: p.detach().clone() for name, p in model.named_parameters()})


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


def test_two_colocated_vllm_stages_are_refused_up_front(tmp_path, tiny_model_path):
    colocated = dict(use_vllm=True, vllm_mode="colocate")
    with pytest.raises(NotImplementedError, match=r"Stages \[0, 1\] all use vllm_mode='colocate'"):
        SequentialTrainer(
            model=tiny_model_path,
            stages=[fast_es_config(tmp_path, **colocated), fast_grpo_config(tmp_path, **colocated)],
            output_dir=tmp_path / "run",
            reward_funcs=digit_fraction,
            train_dataset=digit_prompts(8),
        )
