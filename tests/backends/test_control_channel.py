"""The control secret of a `trl-es vllm-serve` server (`trl_es.backends.control_channel`, no vLLM needed): written
readable only by its owner, refused when others can read it, and found by the trainer in its file, the environment or
the server's default file."""

import stat

import pytest

from trl_es.backends.control_channel import (
    SECRET_ENV,
    SecretError,
    default_secret_file,
    read_secret,
    trainer_secret,
    write_new_secret,
)


def test_a_new_secret_is_written_readable_only_by_its_owner(tmp_path):
    path = tmp_path / "folder" / "server.secret"
    secret = write_new_secret(path)
    assert len(secret) >= 32 and read_secret(path) == secret
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert write_new_secret(path) != secret  # every new secret is fresh


@pytest.mark.parametrize("mode", [0o640, 0o604])
def test_a_secret_file_that_others_can_read_is_refused(tmp_path, mode):
    path = tmp_path / "server.secret"
    write_new_secret(path)
    path.chmod(mode)
    with pytest.raises(SecretError, match=rf"{path} \(mode .*\) can be read or changed by other users.*chmod 600"):
        read_secret(path)


def test_a_missing_secret_file_says_where_the_server_writes_one(tmp_path):
    with pytest.raises(SecretError, match=rf"No control secret at {tmp_path / 'none'}\..*vllm_server_secret_file"):
        read_secret(tmp_path / "none")


def test_the_trainer_takes_its_file_then_the_environment_then_the_servers_default_file(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(SECRET_ENV, raising=False)
    default = write_new_secret(default_secret_file(8123))
    assert trainer_secret(None, 8123) == (default, str(tmp_path / "cache" / "trl-es" / "vllm-server-8123.secret"))
    monkeypatch.setenv(SECRET_ENV, "s" * 40)
    assert trainer_secret(None, 8123) == ("s" * 40, f"${SECRET_ENV}")
    given = write_new_secret(tmp_path / "given")
    assert trainer_secret(str(tmp_path / "given"), 8123) == (given, str(tmp_path / "given"))


def test_a_short_secret_in_the_environment_is_refused_by_trainer_and_server(tmp_path, monkeypatch):
    """Issue 27: a one-character TRL_ES_SERVER_SECRET was accepted (a secret file needed 16)."""
    from trl_es.backends.vllm_control import server_secret
    from trl_es.cli.vllm_serve import prepare_secret

    monkeypatch.setenv(SECRET_ENV, "x")
    for read in (lambda: trainer_secret(None, 8123), server_secret, lambda: prepare_secret(None)):
        with pytest.raises(SecretError, match=rf"\${SECRET_ENV} is 1 characters long; use at least 16"):
            read()
    monkeypatch.setenv(SECRET_ENV, "s" * 16)
    assert trainer_secret(None, 8123) == ("s" * 16, f"${SECRET_ENV}") and server_secret() == "s" * 16
