"""The configs of an ES→GRPO or GRPO→ES run, built from one set of flags (`trl_es.sequential.stage_configs`): the GRPO
stage keeps GRPO's defaults for the fields ES redefines and copies the other flags, overrides set their stage only,
and a bad override or an invalid GRPO stage says what to change."""

import pytest
import torch
from trl import GRPOConfig

from trl_es import ESConfig
from trl_es.sequential.stage_configs import ES_REDEFINED_FIELDS, SequenceArguments, stage_configs


def es_args(tmp_path, **overrides) -> ESConfig:
    settings = dict(output_dir=str(tmp_path / "run"), use_cpu=True, per_device_train_batch_size=8, report_to="none")
    return ESConfig(**{**settings, **overrides})


def test_es_redefined_fields_are_the_ones_whose_defaults_differ():
    assert {"learning_rate", "lr_scheduler_type", "num_generations", "temperature"} <= set(ES_REDEFINED_FIELDS)
    assert {"bf16", "disable_dropout"} <= set(ES_REDEFINED_FIELDS)
    assert "max_steps" not in ES_REDEFINED_FIELDS


def test_the_grpo_stage_keeps_grpo_defaults_for_the_fields_es_redefines(tmp_path):
    args = es_args(tmp_path, learning_rate=1e-3, temperature=0.5, lr_scheduler_type="cosine", disable_dropout=False)
    with pytest.warns(UserWarning, match="configure the ES stage only: .*learning_rate=0.001"):
        es_stage, grpo_stage = stage_configs(args, "es-then-grpo")
    assert isinstance(es_stage, ESConfig) and type(grpo_stage) is GRPOConfig
    assert (es_stage.learning_rate, es_stage.temperature, es_stage.num_generations) == (1e-3, 0.5, 1)
    defaults = GRPOConfig(output_dir=str(tmp_path), use_cpu=True)
    for name in ("learning_rate", "lr_scheduler_type", "num_generations", "temperature", "disable_dropout"):
        assert getattr(grpo_stage, name) == getattr(defaults, name), name


def test_the_grpo_stage_copies_the_other_flags(tmp_path):
    args = es_args(tmp_path, max_steps=7, max_completion_length=12, seed=3, top_p=0.9, beta=0.04)
    _, grpo_stage = stage_configs(args)
    assert (grpo_stage.max_steps, grpo_stage.max_completion_length, grpo_stage.seed) == (7, 12, 3)
    assert (grpo_stage.top_p, grpo_stage.beta, grpo_stage.use_cpu, grpo_stage.per_device_train_batch_size) == (
        0.9,
        0.04,
        True,
        8,
    )
    assert grpo_stage.output_dir == args.output_dir and not grpo_stage.push_to_hub


def test_without_overrides_the_es_stage_is_the_parsed_config(tmp_path):
    args = es_args(tmp_path, population_size=6, sigma=0.01, max_steps=3, temperature=0.7, model_init_kwargs={"a": 1})
    es_stage, _ = stage_configs(args)
    assert es_stage.to_dict() == args.to_dict()


def test_overrides_set_fields_of_their_stage_only(tmp_path):
    args = es_args(tmp_path, max_steps=5)
    es_stage, grpo_stage = stage_configs(
        args,
        es_overrides={"max_steps": 3, "sigma": 0.01},
        grpo_overrides='{"learning_rate": 2e-6, "max_steps": 50, "num_generations": 4}',
    )
    assert (es_stage.max_steps, es_stage.sigma, es_stage.learning_rate) == (3, 0.01, 5e-4)
    assert (grpo_stage.max_steps, grpo_stage.learning_rate, grpo_stage.num_generations) == (50, 2e-6, 4)


def test_grpo_then_es_puts_the_grpo_stage_first(tmp_path):
    stages = stage_configs(es_args(tmp_path), "grpo-then-es")
    assert [type(stage) for stage in stages] == [GRPOConfig, ESConfig]
    with pytest.raises(ValueError, match="Unknown order 'es-then-sft': use one of es-then-grpo, grpo-then-es"):
        stage_configs(es_args(tmp_path), "es-then-sft")


def test_an_unknown_override_key_names_the_key_and_the_field_it_meant(tmp_path):
    with pytest.raises(ValueError, match=r"grpo_overrides has the key 'learning_rat'.*Did you mean 'learning_rate'"):
        stage_configs(es_args(tmp_path), grpo_overrides={"learning_rat": 1e-6})
    with pytest.raises(ValueError, match=r"population_size is an ES field: set it as a top-level flag .*es_overrides"):
        stage_configs(es_args(tmp_path), grpo_overrides={"population_size": 8})


def test_overrides_are_read_from_json_and_yaml_number_strings():
    sequence = SequenceArguments(order="grpo-then-es", grpo_overrides='{"max_steps": 50}', es_overrides=None)
    assert (sequence.grpo_overrides, sequence.es_overrides) == ({"max_steps": 50}, {})
    # YAML reads `1e-6` as a string; the override converts it as the command line would.
    assert SequenceArguments(grpo_overrides={"learning_rate": "1e-6", "bf16": "false"}).grpo_overrides == {
        "learning_rate": 1e-6,
        "bf16": False,
    }
    with pytest.raises(ValueError, match=r"grpo_overrides is not valid JSON .*--grpo_overrides '\{"):
        SequenceArguments(grpo_overrides="{max_steps: 50}")


def test_an_invalid_grpo_stage_says_to_use_grpo_overrides(tmp_path):
    args = es_args(tmp_path, per_device_train_batch_size=4)  # GRPO's 8 completions per prompt do not fit
    with pytest.raises(ValueError, match=r"(?s)The GRPO stage's GRPOConfig is invalid: .*--grpo_overrides"):
        stage_configs(args)


def test_a_grpo_stage_trains_with_a_config_whose_pickle_and_logged_settings_hold_no_token(tmp_path):
    """Issue 27: a GRPO stage's training_args.bin held its hub_token and any token in model_init_kwargs."""
    import io
    import pickle

    from trl_es.sequential.stage_configs import training_config

    token = "hf_" + "q" * 34
    grpo = GRPOConfig(str(tmp_path), hub_token=token, model_init_kwargs={"token": token}, bf16=False)
    stage_args = training_config(grpo)
    assert isinstance(stage_args, GRPOConfig) and stage_args.hub_token == token  # trains with the real values
    assert stage_args.model_init_kwargs == {"token": token} and stage_args.learning_rate == grpo.learning_rate
    buffer = io.BytesIO()
    torch.save(stage_args, buffer)  # as the Trainer writes training_args.bin
    assert token.encode() not in buffer.getvalue()
    loaded = torch.load(io.BytesIO(buffer.getvalue()), weights_only=False)
    assert loaded.hub_token is None and loaded.model_init_kwargs == {"token": None}
    assert token not in stage_args.to_json_string() and token not in repr(stage_args)
    assert str(tmp_path) not in stage_args.to_json_string()  # what loggers record names no local path either
    assert token.encode() not in pickle.dumps(stage_args)
    es = training_config(ESConfig(str(tmp_path), hub_token=token))
    assert type(es) is ESConfig and es.hub_token == token
