"""coverage_report: its measurements agree with each other on the embedded arithmetic model."""

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from trl_es.arithmetic import arithmetic_dataset, extract_answer
from trl_es.demo import DEMO_MODEL
from trl_es.evaluation import coverage_report


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
