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


# The protocol's pieces (the server and the trainer use them; tests/backends/test_vllm_server.py runs them for real).


def test_a_server_proof_is_bound_to_the_secret_and_to_the_clients_nonce():
    from trl_es.backends.control_channel import new_nonce, server_proof, signatures_match

    secret, nonce = "s" * 32, new_nonce()
    proof = server_proof(secret, nonce, "server-nonce", "session", "instance")
    assert signatures_match(proof, server_proof(secret, nonce, "server-nonce", "session", "instance"))
    for other in (server_proof("t" * 32, nonce, "server-nonce", "session", "instance"),  # another secret
                  server_proof(secret, new_nonce(), "server-nonce", "session", "instance"),  # a recorded answer
                  server_proof(secret, nonce, "server-nonce", "session", "another instance")):  # fmt: skip
        assert not signatures_match(proof, other)


def test_a_request_signature_covers_method_path_counter_and_body_and_its_answer_is_bound_to_it():
    from trl_es.backends.control_channel import answer_signature, request_signature, session_key, signatures_match

    key = session_key("s" * 32, "client", "server", "session")
    request = ("POST", "/trl_es/v2/es_init", 3, b'{"args": []}')
    signed = request_signature(key, *request)
    for position, changed in enumerate(["GET", "/trl_es/v2/es_verify", 4, b'{"args": [1]}']):
        altered = list(request)
        altered[position] = changed
        assert not signatures_match(signed, request_signature(key, *altered)), altered
    assert not signatures_match(signed, request_signature(session_key("s" * 32, "client", "server", "x"), *request))
    answer = answer_signature(key, signed, 200, b"body")
    assert not signatures_match(answer, answer_signature(key, signed, 500, b"body"))
    assert not signatures_match(answer, answer_signature(key, "another request", 200, b"body"))
    assert not signatures_match(answer, None) and not signatures_match(answer, "")


def test_the_replay_window_accepts_each_counter_once_in_any_order_within_the_window():
    from trl_es.backends.control_channel import ReplayWindow

    window = ReplayWindow(size=8)
    assert [window.accept(counter) for counter in (0, 2, 1, 2, 0)] == [True, True, True, False, False]
    assert window.accept(20) and not window.accept(12) and window.accept(13)  # older than the window: refused
    for counter in range(21, 200):  # the memory stays bounded
        assert window.accept(counter)
    assert len(window.seen) <= 2 * 8 and not window.accept(150) and not window.accept(-1)
