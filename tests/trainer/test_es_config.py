import dataclasses
import warnings
from types import SimpleNamespace

import pytest
from trl import GRPOConfig

from trl_es import ESConfig
from trl_es.trainer.config_checks import splits_master
from trl_es.trainer.grpo_conversion import GRPO_ONLY_FIELDS
from trl_es.trainer.released_model import releases_model


def test_es_defaults_follow_the_anchor_paper(tmp_path):
    config = ESConfig(str(tmp_path))
    assert (config.population_size, config.sigma, config.learning_rate) == (30, 1e-3, 5e-4)
    assert config.antithetic is False and config.fitness_shaping == "zscore"
    assert config.num_generations == 1 and config.temperature == 0.0  # greedy, one completion per prompt
    assert config.lr_scheduler_type == "constant"


@pytest.mark.parametrize(
    ("fields", "placed"),
    [({}, None), ({"use_vllm": True}, False), ({"use_vllm": True, "offload_model": False}, None)],
)
def test_only_a_model_kept_in_host_memory_is_never_placed_on_the_accelerator(tmp_path, fields, placed):
    # `TrainingArguments.place_model_on_device`: None lets the Trainer decide (it places the model).
    assert ESConfig(str(tmp_path), **fields).place_model_on_device is placed


def test_is_a_grpo_config_so_every_grpo_field_is_accepted(tmp_path):
    config = ESConfig(str(tmp_path), max_completion_length=32, top_p=0.9, reward_weights=[1.0], vllm_mode="colocate")
    assert isinstance(config, GRPOConfig)
    grpo_fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    assert grpo_fields <= {f.name for f in dataclasses.fields(ESConfig)}


def test_es_fields_have_help_and_docstring_entries():
    for name in (
        "population_size",
        "sigma",
        "antithetic",
        "fitness_shaping",
        "normalize_fitness_per_prompt",
        "fitness_pass_at_k",
        "sigma_schedule",
        "sigma_final",
        "sigma_target_js_diversity",
        "sigma_adaptation_rate",
        "learning_rate",
    ):
        spec = ESConfig.__dataclass_fields__[name]
        assert spec.metadata.get("help"), name
        assert f"{name} (`" in ESConfig.__doc__, name


def test_grpo_only_fields_exist_in_grpo_config():
    assert set(GRPO_ONLY_FIELDS) <= set(GRPOConfig.__dataclass_fields__)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"population_size": 1}, "population_size must be an integer >= 2 .*got 1"),
        ({"population_size": 5, "antithetic": True}, "must be even; got 5"),
        ({"sigma": 0.0}, "sigma must be a finite number > 0, got 0.0"),
        ({"sigma": -1e-3}, "got -0.001"),
        ({"fitness_shaping": "softmax"}, "Unknown fitness_shaping='softmax'; use one of zscore"),
        ({"learning_rate": -1.0}, "learning_rate .* got -1.0"),
        ({"temperature": -0.5}, "temperature must be >= 0"),
        ({"num_generations": 0}, "num_generations must be >= 1, got 0"),
        ({"fitness_pass_at_k": 0}, "fitness_pass_at_k must be an integer >= 1 or None, got 0"),
        ({"fitness_pass_at_k": 4, "num_generations": 2, "temperature": 1.0}, "Set num_generations >= 4"),
        ({"top_p": 5}, r"top_p must be a number in \(0, 1\] .*got 5"),
        ({"top_p": 0.0}, r"top_p must be a number in \(0, 1\]"),
        ({"min_p": 1.5}, r"min_p must be a number in \[0, 1\] or None, got 1.5"),
        ({"top_k": -3}, "top_k must be an integer >= 0 .*got -3"),
        ({"repetition_penalty": 0.0}, "repetition_penalty must be a number > 0"),
        ({"sigma_schedule": "step"}, "Unknown sigma_schedule='step'; use one of constant, linear, cosine"),
        ({"sigma_schedule": "linear"}, "sigma_final must be a finite number > 0, got None. E.g. sigma_final=0.00025"),
        ({"sigma_schedule": "cosine", "sigma_final": -1.0}, "sigma_final must be a finite number > 0, got -1.0"),
        ({"sigma_target_js_diversity": 1.5}, r"sigma_target_js_diversity must lie in \(0, 1\] .*got 1.5"),
        ({"sigma_target_js_diversity": 0.1, "sigma_schedule": "linear", "sigma_final": 1e-4}, "use one"),
        ({"sigma_target_js_diversity": 0.1, "sigma_adaptation_rate": 0.0}, "sigma_adaptation_rate must be .* got 0.0"),
        # Values that made the master non-finite, or that transformers and numpy refused only at train time (issue 16)
        ({"weight_decay": float("nan")}, "weight_decay must be a finite number >= 0, got nan"),
        ({"weight_decay": -0.1}, "weight_decay must be a finite number >= 0, got -0.1"),
        ({"weight_decay": 1e39}, "weight_decay must be a finite number >= 0, got 1e[+]39"),
        ({"learning_rate": 1e39}, r"learning_rate .* float32 can hold .* got 1e\+39"),
        ({"learning_rate": float("inf")}, "learning_rate .* got inf"),
        ({"sigma": 1e39}, r"sigma=1e\+39 overflows float32"),
        ({"learning_rate": 0.5, "weight_decay": 2.0}, "learning_rate [*] weight_decay = 0.5 [*] 2.0 >= 1"),
        ({"reward_weights": [1.0, float("nan")]}, r"reward_weights must be finite numbers, got \[1.0, nan\]"),
        ({"max_completion_length": 0}, "max_completion_length must be an integer >= 1 .*got 0"),
        ({"seed": -1}, r"seed must be an integer in \[0, 2\*\*32 - 1\] .*got -1"),
        ({"data_seed": 2**32}, r"data_seed must be an integer in \[0, 2\*\*32 - 1\] .*got 4294967296"),
        ({"noise_seed": -3}, "noise_seed must be an integer >= 0 .*got -3"),
    ],
)
def test_invalid_values_fail_at_construction_naming_the_value(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        ESConfig(str(tmp_path), **overrides)


def test_a_learning_rate_of_one_or_more_warns_that_it_erases_the_model(tmp_path):
    with pytest.warns(UserWarning, match="learning_rate=2.0 is the ES step size"):
        ESConfig(str(tmp_path), learning_rate=2.0)


def test_one_completion_per_prompt_is_valid_with_any_batch_size(tmp_path):
    config = ESConfig(str(tmp_path), per_device_train_batch_size=3, num_generations=1)
    assert config.num_generations == 1 and config.generation_batch_size == 3


def test_several_completions_must_divide_the_generation_batch(tmp_path):
    with pytest.raises(ValueError, match="divisible by num_generations"):
        ESConfig(str(tmp_path), per_device_train_batch_size=3, num_generations=2, temperature=1.0)


def test_grpo_loss_fields_warn_that_es_ignores_them(tmp_path):
    with pytest.warns(UserWarning, match="ignores GRPO loss settings: beta=0.04, loss_type='grpo'"):
        ESConfig(str(tmp_path), beta=0.04, loss_type="grpo")


def test_default_config_does_not_warn(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ESConfig(str(tmp_path))


def test_greedy_decoding_with_several_completions_warns(tmp_path):
    with pytest.warns(UserWarning, match="identical completions"):
        ESConfig(str(tmp_path), num_generations=2, per_device_train_batch_size=4)


def test_from_grpo_config_keeps_user_settings_but_not_the_adamw_learning_rate(tmp_path):
    grpo = GRPOConfig(
        str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=4,
        temperature=0.7,
        max_completion_length=32,
        learning_rate=1e-6,
        beta=0.1,
        bf16=False,
        logging_steps=3,
    )
    config = ESConfig.from_grpo_config(grpo)
    assert isinstance(config, ESConfig)
    assert (config.num_generations, config.temperature, config.max_completion_length) == (4, 0.7, 32)
    assert config.logging_steps == 3 and config.output_dir == str(tmp_path)
    assert config.learning_rate == 5e-4  # ES step size, not GRPO's AdamW rate
    assert config.beta == ESConfig.__dataclass_fields__["beta"].default
    assert config.activation_checkpointing is False  # GRPO's default, pointless without a backward pass


def test_from_grpo_config_keeps_sampling_for_a_grpo_group(tmp_path):
    grpo = GRPOConfig(str(tmp_path), per_device_train_batch_size=4, num_generations=4, bf16=False)
    config = ESConfig.from_grpo_config(grpo)
    assert config.num_generations == 4 and config.temperature == grpo.temperature == 1.0


SECRET = "hf_" + "ZyXwVuTsRqPoNmLkJiHgFeDcBaZyXw"


def secret_config(output_dir) -> ESConfig:
    """A config holding a token at the top level and nested, and local paths."""
    return ESConfig(
        str(output_dir),
        hub_token=SECRET,
        model_init_kwargs={"token": SECRET, "dtype": "float32", "cache_dir": f"{output_dir}/hf-cache"},
        generation_kwargs={"extra": [{"Authorization": f"Bearer {SECRET}"}]},
        vllm_server_secret_file=f"{output_dir}/server.secret",
    )


def test_the_pickled_config_leaves_every_token_out_and_copies_keep_them(tmp_path):
    import copy
    import io

    import torch

    config = secret_config(tmp_path)
    pickled = io.BytesIO()
    torch.save(config, pickled)  # what transformers writes to training_args.bin at every save
    assert SECRET.encode() not in pickled.getvalue()
    pickled.seek(0)
    loaded = torch.load(pickled, weights_only=False)
    assert loaded.hub_token is None and loaded.model_init_kwargs == {
        "token": None,  # from_pretrained then logs in as the machine it runs on does
        "dtype": "float32",
        "cache_dir": f"{tmp_path}/hf-cache",  # the file stays local (pushes leave it out): its paths stay
    }
    assert loaded.generation_kwargs == {"extra": [{"Authorization": None}]}
    assert loaded.output_dir == str(tmp_path) and loaded.population_size == config.population_size
    for copied in (copy.copy(config), copy.deepcopy(config)):
        assert copied.hub_token == copied.model_init_kwargs["token"] == SECRET
        assert copied.generation_kwargs == config.generation_kwargs
    assert config.model_init_kwargs["token"] == SECRET  # pickling changed nothing in the config itself


def test_what_loggers_record_holds_no_token_and_no_local_path(tmp_path):
    """W&B, MLflow, Comet... record `to_dict()`; TensorBoard `to_json_string()` and `to_sanitized_dict()`."""
    config = secret_config(tmp_path / "es-run")
    recorded = config.to_dict()
    assert recorded["hub_token"] == "<HUB_TOKEN>" and recorded["model_init_kwargs"]["token"] == "<TOKEN>"
    assert recorded["generation_kwargs"] == {"extra": [{"Authorization": "<AUTHORIZATION>"}]}
    assert recorded["output_dir"] == "es-run" and recorded["vllm_server_secret_file"] == "server.secret"
    assert recorded["model_init_kwargs"]["cache_dir"] == "hf-cache"
    for text in (config.to_json_string(), str(config.to_sanitized_dict())):
        assert SECRET not in text and str(tmp_path) not in text
    assert config.model_init_kwargs["token"] == SECRET and config.output_dir == str(tmp_path / "es-run")


def test_the_printed_config_hides_nested_tokens_and_keeps_paths(tmp_path):
    config = secret_config(tmp_path)
    for text in (str(config), repr(config), f"{[config]}"):
        assert SECRET not in text and "'token': '<TOKEN>'" in text and f"output_dir={tmp_path}," in text


def test_hub_push_logs_is_off_by_default_with_help():
    spec = ESConfig.__dataclass_fields__["hub_push_logs"]
    assert spec.default is False and "runs/" in spec.metadata["help"]
    assert "hub_push_logs (`bool`, *optional*, defaults to `False`)" in ESConfig.__doc__


def test_a_tensor_parallel_colocated_engine_needs_whole_groups_of_processes_and_full_rank_members(tmp_path):
    """vllm_tensor_parallel_size processes share an engine: a launch must give every engine its whole group."""
    with pytest.raises(ValueError, match=r"vllm_tensor_parallel_size=2 must divide the number of processes \(1\)"):
        ESConfig(str(tmp_path), use_vllm=True, vllm_mode="colocate", vllm_tensor_parallel_size=2)
    with pytest.raises(NotImplementedError, match="perturbation='lowrank' with vllm_tensor_parallel_size=2"):
        ESConfig(str(tmp_path), use_vllm=True, vllm_mode="colocate", vllm_tensor_parallel_size=2,
                 perturbation="lowrank", lowrank_other_parameters="frozen")  # fmt: skip
    with pytest.raises(NotImplementedError, match="splits the float32 master.*master_dtype='compensated_bfloat16'"):
        ESConfig(str(tmp_path), use_vllm=True, vllm_mode="colocate", vllm_tensor_parallel_size=2,
                 master_dtype="compensated_bfloat16")  # fmt: skip
    assert ESConfig(str(tmp_path), use_vllm=True, vllm_mode="colocate").vllm_tensor_parallel_size == 1


@pytest.mark.parametrize(
    "settings, world_size, releases, splits",
    [
        ({}, 2, False, False),  # model.generate runs the trainer's model on every process
        ({"use_vllm": True}, 1, False, False),
        ({"use_vllm": True}, 2, True, False),  # an engine each: the whole master on every process
        ({"use_vllm": True, "master_dtype": "compensated_bfloat16"}, 2, False, False),  # its value half is the model
        ({"use_vllm": True, "perturbation": "lowrank"}, 2, False, False),
        ({"use_vllm": True, "vllm_tensor_parallel_size": 2}, 2, True, True),
        ({"use_vllm": True, "vllm_mode": "server"}, 2, True, True),
        ({"use_vllm": True, "vllm_mode": "server", "shard_update": False}, 2, True, False),
        ({"use_vllm": True, "vllm_mode": "server"}, 1, False, False),
    ],
)
def test_which_runs_release_the_model_and_split_the_master_between_their_processes(
    settings, world_size, releases, splits
):
    defaults = dict(use_vllm=False, vllm_mode="colocate", vllm_tensor_parallel_size=1, perturbation="full",
                    master_dtype="float32", shard_update=True)  # fmt: skip
    config = SimpleNamespace(**{**defaults, **settings}, world_size=world_size)
    assert (releases_model(config), splits_master(config)) == (releases, splits)


def test_fsdp_is_refused_naming_the_setting_and_the_layout_for_large_models(tmp_path, monkeypatch):
    # Accelerate would wrap the model in FSDP at train (prepare_model's evaluation mode skips it, FSDP2 does not).
    with pytest.raises(NotImplementedError, match=r"under FSDP \(fsdp=.*vllm_tensor_parallel_size.*multi_gpu.yaml"):
        ESConfig(output_dir=str(tmp_path), fsdp=True)
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")  # what `accelerate launch` sets for an FSDP config
    with pytest.raises(NotImplementedError, match=r"under FSDP \(ACCELERATE_USE_FSDP=true\)"):
        ESConfig(output_dir=str(tmp_path))
