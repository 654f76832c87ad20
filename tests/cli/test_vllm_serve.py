"""`trl-es vllm-serve` (`trl_es.cli.vllm_serve`, no vLLM needed): the secret it writes or reuses, and the command that
starts the server: private files only, never on a command line, vLLM's dev mode off. The secret files themselves are
tested in tests/backends/test_control_channel.py."""

import os

import pytest
from scripts.server_vllm_required import ALLOW_MISSING_VLLM, require_module

from trl_es.backends.control_channel import (
    CHECKPOINT_DIR_ENV,
    SECRET_ENV,
    SECRET_FILE_ENV,
    SecretError,
    read_secret,
    write_new_secret,
)
from trl_es.cli.main import build_parser
from trl_es.cli.vllm_serve import CONTROL_MIDDLEWARE, WORKER_EXTENSION, prepare_secret, server_command


def serve_args(*flags):
    return build_parser().parse_args(["vllm-serve", "--model", "some/model", *flags])


def test_the_server_writes_a_new_secret_at_every_start_unless_given_one(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(SECRET_ENV, raising=False)
    default = prepare_secret(serve_args("--port", "8124"))
    first = read_secret(default)
    assert prepare_secret(serve_args("--port", "8124")) == default and read_secret(default) != first
    given = tmp_path / "given.secret"
    assert prepare_secret(serve_args("--secret_file", str(given))) == str(given)
    kept = read_secret(given)
    prepare_secret(serve_args("--secret_file", str(given)))
    assert read_secret(given) == kept  # a file the user keeps is reused, so restarts keep the secret
    given.chmod(0o644)
    with pytest.raises(SecretError, match="chmod 600"):
        prepare_secret(serve_args("--secret_file", str(given)))
    monkeypatch.setenv(SECRET_ENV, "e" * 40)
    assert prepare_secret(serve_args()) is None  # the environment holds it; nothing is written


def test_server_command_binds_locally_without_dev_mode_and_keeps_the_secret_off_the_command_line(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")
    secret_file = tmp_path / "server.secret"
    secret = write_new_secret(secret_file)
    args = serve_args("--checkpoint_dir", str(tmp_path), "--", "--enforce-eager")
    command, environment = server_command(args, str(secret_file))
    assert command[command.index("--host") + 1] == "127.0.0.1"
    assert command[command.index("--worker-extension-cls") + 1] == WORKER_EXTENSION
    assert command[command.index("--middleware") + 1] == CONTROL_MIDDLEWARE
    assert command[-1] == "--enforce-eager"
    assert environment["VLLM_SERVER_DEV_MODE"] == "0"  # no /collective_rpc, whatever the caller's environment says
    assert environment[SECRET_FILE_ENV] == str(secret_file) and secret not in " ".join(command)
    assert environment[CHECKPOINT_DIR_ENV] == os.path.realpath(tmp_path)
    _, environment = server_command(serve_args(), str(secret_file))
    assert CHECKPOINT_DIR_ENV not in environment  # no --checkpoint_dir: no checkpoint is readable


def test_a_missing_vllm_fails_the_server_tests_unless_skipping_them_is_allowed_explicitly(monkeypatch):
    monkeypatch.delenv(ALLOW_MISSING_VLLM, raising=False)
    with pytest.raises(pytest.fail.Exception, match=f"not installed.*or set {ALLOW_MISSING_VLLM}=1 to skip them"):
        require_module("trl_es_no_such_module")
    monkeypatch.setenv(ALLOW_MISSING_VLLM, "1")
    with pytest.raises(pytest.skip.Exception):
        require_module("trl_es_no_such_module")
