"""coverage_report: its measurements agree with each other on the embedded arithmetic model."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from trl_es.demo.run import DEMO_MODEL
from trl_es.evaluation.coverage import TransformersSampler, completion_entropy, coverage_report
from trl_es.tasks.arithmetic import arithmetic_dataset, extract_answer


@pytest.fixture(scope="module")
def report():
    test = arithmetic_dataset("test", 16)
    model, tokenizer = AutoModelForCausalLM.from_pretrained(DEMO_MODEL), AutoTokenizer.from_pretrained(DEMO_MODEL)
    return coverage_report(
        model, tokenizer, list(test["prompt"]), list(test["answer"]), extract_answer, ks=(1, 4), samples_per_prompt=4
    )


def test_pass_at_1_and_maj_at_1_are_the_mean_per_prompt_success_probability(report):
    assert len(report.success_probs) == report.num_prompts == 16
    mean = sum(report.success_probs) / 16
    assert report.pass_at_k[1] == pytest.approx(mean)
    assert report.maj_at_k[1] == pytest.approx(mean)


def test_pass_at_n_is_the_fraction_of_prompts_with_any_correct_sample(report):
    assert report.pass_at_k[4] == pytest.approx(sum(p > 0 for p in report.success_probs) / 16)
    assert report.token_entropy > 0.0


def test_asking_for_k_above_the_samples_is_an_error():
    with pytest.raises(ValueError, match="samples_per_prompt=2"):
        coverage_report(None, None, ["q"], ["1"], extract_answer, ks=(1, 4), samples_per_prompt=2)


def test_teacher_forced_entropy_equals_the_entropy_of_the_generation_logits():
    # The entropy is measured by a forward pass over the sampled tokens, so that vLLM samples are measured like
    # `model.generate` samples; here it is checked against the logits that `generate` computed while sampling.
    model, tokenizer = AutoModelForCausalLM.from_pretrained(DEMO_MODEL), AutoTokenizer.from_pretrained(DEMO_MODEL)
    prompt_ids = [tokenizer(p)["input_ids"] for p in arithmetic_dataset("test", 4)["prompt"]]
    torch.manual_seed(0)
    completions, expected = [], []
    for ids in prompt_ids:
        output = model.generate(torch.tensor([ids]), do_sample=True, top_k=0, max_new_tokens=8, output_logits=True,
                                return_dict_in_generate=True, pad_token_id=tokenizer.pad_token_id)  # fmt: skip
        completion = output.sequences[0, len(ids) :].tolist()
        if tokenizer.eos_token_id in completion:
            completion = completion[: completion.index(tokenizer.eos_token_id) + 1]
        log_probs = torch.stack(output.logits[: len(completion)]).squeeze(1).log_softmax(-1)
        completions.append([completion])
        expected.append((float(-(log_probs.exp() * log_probs).sum()), len(completion)))
    measured = completion_entropy(model, prompt_ids, completions, max_logits=3 * 20 * 300)  # several batches
    for (got_sum, got_count), (want_sum, want_count) in zip(measured, expected, strict=True):
        assert got_count == want_count
        assert got_sum == pytest.approx(want_sum, rel=1e-4)


def test_completions_end_at_the_first_eos_and_repeat_with_the_seed():
    model, tokenizer = AutoModelForCausalLM.from_pretrained(DEMO_MODEL), AutoTokenizer.from_pretrained(DEMO_MODEL)
    prompt_ids = [tokenizer(p)["input_ids"] for p in arithmetic_dataset("test", 6)["prompt"]]
    sampler = TransformersSampler(model, tokenizer, batch_size=4)  # several batches
    first, again = (sampler.sample(prompt_ids, 4, 1.0, 12, seed=7) for _ in range(2))
    assert first == again
    rows = [completion for completions in first for completion in completions]
    assert all(tokenizer.eos_token_id not in completion[:-1] for completion in rows)
    assert any(completion[-1] == tokenizer.eos_token_id for completion in rows)
