"""What a run's settings show once they leave the process (`trl_es.trainer.redaction`): secrets hidden at any depth,
local paths by their last component."""

import pytest

from trl_es.trainer.redaction import (
    is_local_path,
    is_secret_key,
    pickle_state,
    public,
    public_path,
    without_local_paths,
    without_secrets,
)

TOKEN = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYzAbCd"


@pytest.mark.parametrize(
    "key", ["token", "hub_token", "HF_TOKEN", "Access_Token", "api_key", "OPENAI_API_KEY", "Authorization", "secret"]
)
def test_keys_named_like_a_secret_are_secret_in_any_case(key):
    assert is_secret_key(key)


@pytest.mark.parametrize(
    "key", ["tokens", "max_new_tokens", "token_id", "pad_token_id", "vllm_server_secret_file", "tokenizer", 3]
)
def test_keys_that_only_mention_tokens_are_not_secret(key):
    assert not is_secret_key(key)


def test_secrets_are_hidden_at_any_depth_of_dicts_and_lists():
    settings = {
        "model_init_kwargs": {"token": TOKEN, "dtype": "float32"},
        "vllm_kwargs": [{"headers": {"Authorization": "Bearer abc"}}, ("API_KEY", {"api_key": "sk-1"})],
        "hub_token": "plain",
    }
    assert without_secrets(settings) == {
        "model_init_kwargs": {"token": "<TOKEN>", "dtype": "float32"},
        "vllm_kwargs": [{"headers": {"Authorization": "<AUTHORIZATION>"}}, ("API_KEY", {"api_key": "<API_KEY>"})],
        "hub_token": "<HUB_TOKEN>",
    }
    assert settings["model_init_kwargs"]["token"] == TOKEN  # the argument is left as it was


def test_a_hugging_face_token_is_hidden_under_any_key():
    assert without_secrets({"extra": [f"Bearer {TOKEN}"], "name": "hf_short"}) == {
        "extra": ["<TOKEN>"],
        "name": "hf_short",
    }


def test_none_and_booleans_under_a_secret_key_stay():
    assert without_secrets({"token": True, "hub_token": None}) == {"token": True, "hub_token": None}


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("/home/me/runs/es-tiny", "es-tiny"),
        ("/home/me/runs/es-tiny/", "es-tiny"),
        ("~/.cache/trl-es/vllm-server-8000.secret", "vllm-server-8000.secret"),
        ("C:\\Users\\me\\runs\\es", "es"),
        ("\\\\server\\share\\run", "run"),
        ("/", "/"),
    ],
)
def test_a_local_path_is_shown_by_its_last_component(text, shown):
    assert is_local_path(text) and public_path(text) == shown


@pytest.mark.parametrize("text", ["es-tiny", "runs/es", "Qwen/Qwen2.5-0.5B", "http://127.0.0.1:8000", "a\n/b"])
def test_relative_paths_hub_ids_and_urls_stay(text):
    assert not is_local_path(text) and public_path(text) == text


def test_local_paths_are_shortened_at_any_depth_and_other_values_stay():
    settings = {"output_dir": "/tmp/x/run", "kwargs": {"cache_dir": "/scratch/me/hf", "n": [1, ("/a/b", 2.0)]}}
    assert without_local_paths(settings) == {"output_dir": "run", "kwargs": {"cache_dir": "hf", "n": [1, ("b", 2.0)]}}


def test_public_hides_secrets_and_shortens_paths_together():
    assert public({"model_init_kwargs": {"token": TOKEN, "cache_dir": "/scratch/hf"}}) == {
        "model_init_kwargs": {"token": "<TOKEN>", "cache_dir": "hf"}
    }


def test_the_pickle_state_sets_secrets_to_none_and_keeps_paths():
    state = {"hub_token": "x", "model_init_kwargs": {"token": TOKEN}, "output_dir": "/tmp/x/run"}
    assert pickle_state(state) == {"hub_token": None, "model_init_kwargs": {"token": None}, "output_dir": "/tmp/x/run"}
