"""How the master is kept, under ESTrainer. `master_dtype="compensated_bfloat16"`: a bfloat16 model trains with the
compensated master, its checkpoints hold the float32 values and a resume continues bitwise; the settings it cannot
serve are refused. The arithmetic itself (200 updates against a float32 master) is tests/core/test_compensated.py.
`offload_master=True`: the run and its resume are bitwise the run with the master on the device."""

import pytest
import torch
from safetensors.torch import load_file
from scripts.fast_es import MOVING

from trl_es import ESTrainer
from trl_es.core.compensated import CompensatedMasterWeights
from trl_es.core.host_memory import HostTensors
from trl_es.testing import digit_fraction, digit_prompts


def train(output_dir, model_path, make_config, resume=None, **settings):
    config = make_config(**MOVING, output_dir=str(output_dir), max_steps=3, save_strategy="steps", save_steps=1,
                         model_init_kwargs={"dtype": "bfloat16"}, **settings)  # fmt: skip
    trainer = ESTrainer(model=model_path, reward_funcs=digit_fraction, args=config, train_dataset=digit_prompts(8))
    trainer.train(resume_from_checkpoint=resume)
    return trainer, load_file(f"{output_dir}/checkpoint-3/model.safetensors")


def test_a_compensated_master_trains_a_bfloat16_model_and_resumes_bitwise(tiny_model_path, make_config, tmp_path):
    trainer, uninterrupted = train(tmp_path / "a", tiny_model_path, make_config, master_dtype="compensated_bfloat16")
    assert isinstance(trainer.population.master, CompensatedMasterWeights)
    assert all(tensor.dtype == torch.bfloat16 for tensor in uninterrupted.values())
    _, float32_master = train(tmp_path / "f", tiny_model_path, make_config)
    same = sum(int((uninterrupted[name] == float32_master[name]).sum()) for name in uninterrupted)
    assert same >= 0.99 * sum(tensor.numel() for tensor in uninterrupted.values())  # it follows the float32 run
    assert any(not torch.equal(uninterrupted[name], float32_master[name]) for name in uninterrupted)  # not the same
    train(tmp_path / "b", tiny_model_path, make_config, master_dtype="compensated_bfloat16")
    _, resumed = train(tmp_path / "b", tiny_model_path, make_config, resume=str(tmp_path / "b" / "checkpoint-1"),
                       master_dtype="compensated_bfloat16")  # fmt: skip
    assert all(torch.equal(uninterrupted[name], resumed[name]) for name in uninterrupted)


@pytest.mark.parametrize(
    "setting", [{"perturbation": "lowrank"}, {"use_vllm": True, "vllm_mode": "server"}], ids=["lowrank", "server"]
)
def test_a_compensated_master_is_refused_where_a_float32_master_is_kept_elsewhere(setting, make_config):
    with pytest.raises(NotImplementedError, match="master_dtype='compensated_bfloat16' works with full-rank members"):
        make_config(master_dtype="compensated_bfloat16", **setting)


def test_a_host_offloaded_master_trains_and_resumes_bitwise_like_the_master_on_the_device(
    tiny_model_path, make_config, tmp_path
):
    offloaded = dict(offload_master=True, es_optimizer="adam")
    trainer, uninterrupted = train(tmp_path / "a", tiny_model_path, make_config, **offloaded)
    assert isinstance(trainer.population.master.tensors, HostTensors)
    assert set(trainer.population.master.optimizer.state_dict()) == {
        f"{name}.{suffix}" for name in uninterrupted for suffix in ("exp_avg", "exp_avg_sq")
    }
    _, on_device = train(tmp_path / "d", tiny_model_path, make_config, es_optimizer="adam")
    assert all(torch.equal(uninterrupted[name], on_device[name]) for name in uninterrupted)
    _, resumed = train(tmp_path / "a", tiny_model_path, make_config, resume=str(tmp_path / "a" / "checkpoint-1"),
                       **offloaded)  # fmt: skip
    assert all(torch.equal(uninterrupted[name], resumed[name]) for name in uninterrupted)


@pytest.mark.parametrize(
    "setting",
    [{"perturbation": "lowrank"}, {"master_dtype": "compensated_bfloat16"}],
    ids=["lowrank", "compensated"],
)
def test_a_host_offloaded_master_is_refused_where_the_master_is_not_a_full_float32_one(setting, make_config):
    with pytest.raises(NotImplementedError, match="offload_master=True keeps a full-rank float32 master"):
        make_config(offload_master=True, **setting)
