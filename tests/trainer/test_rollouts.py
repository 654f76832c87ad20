"""From prompts to token ids (`trl_es.trainer.rollouts`): what the model's context can hold."""

from types import SimpleNamespace

import pytest

from trl_es.trainer.rollouts import check_prompts_fit, context_length


def test_a_prompt_fits_when_a_whole_completion_fits_after_it_in_the_context():
    check_prompts_fit(["a", "b"], [[1] * 10, [1] * 12], max_completion_length=4, context=16)
    refusal = r"Prompt 1 of this batch \('b'\) is 13 tokens long \(1 prompts .* at most 12"
    with pytest.raises(ValueError, match=refusal):
        check_prompts_fit(["a", "b"], [[1] * 10, [1] * 13], max_completion_length=4, context=16)
    check_prompts_fit(["a"], [[1] * 10_000], max_completion_length=4, context=None)  # a model that does not say


def test_the_context_is_vllms_max_model_length_when_set_else_the_models_positions():
    model = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=512))
    assert context_length(model, SimpleNamespace(use_vllm=False, vllm_max_model_length=128)) == 512
    assert context_length(model, SimpleNamespace(use_vllm=True, vllm_max_model_length=128)) == 128
    assert context_length(model, SimpleNamespace(use_vllm=True, vllm_max_model_length=None)) == 512
    vlm = SimpleNamespace(config=SimpleNamespace(text_config=SimpleNamespace(max_position_embeddings=64)))
    assert context_length(vlm, SimpleNamespace(use_vllm=False, vllm_max_model_length=None)) == 64
