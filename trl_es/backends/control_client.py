"""The trainer's end of the ES control channel (the protocol is in `control_channel.py`).

A `ControlSession` opens a session only with a server that proves it holds the secret, signs every request it sends
in that session, and hands back only answers that the server signed for that very request. The secret itself is
never sent. What a failure means for a training run (an impostor, a restart, a stopped server) is decided by the
server backend (`vllm_server.py`), which turns these exceptions into errors that say what to do.
"""

from __future__ import annotations

import itertools
import json
import threading

import requests

from .control_channel import (
    CONTROL_PATH,
    COUNTER_HEADER,
    HELLO,
    SESSION_HEADER,
    SIGNATURE_HEADER,
    answer_signature,
    new_nonce,
    request_signature,
    server_proof,
    session_key,
    signatures_match,
)


class NoControlChannel(Exception):
    """The server answered the handshake, but not as a trl-es control channel does."""


class ServerNotProven(Exception):
    """The server's handshake proof does not match the secret: it holds another secret, or it is not the server."""


class UnsignedAnswer(Exception):
    """An answer that the session's server did not sign for the request it answers."""

    def __init__(self, response: requests.Response):
        super().__init__(f"HTTP {response.status_code}: {response.text[:1000]}")
        self.response = response


class UnknownSession(UnsignedAnswer):
    """The server says it knows no such session (it may have been restarted; only a new handshake can tell)."""


class ControlSession:
    """A session with a `trl-es vllm-serve` server.

    Args:
        base_url (`str`): The server, e.g. `http://127.0.0.1:8000`.
        secret (`str`): The control secret shared with the server.
        timeout (`float`): Seconds to wait for one request.
        http (`requests.Session`, *optional*): The connection pool to use.
    """

    def __init__(self, base_url: str, secret: str, timeout: float, http: requests.Session | None = None):
        self.base_url, self.timeout = base_url.rstrip("/"), timeout
        self.http = http or requests.Session()
        self._secret = secret
        self._session: str | None = None
        self._key: bytes | None = None
        self._counters = itertools.count()
        self._counter_lock = threading.Lock()

    def open(self) -> str:
        """Open the session: returns the server's instance id once the server proved it holds the secret. Raises
        `ServerNotProven` or `NoControlChannel` otherwise (having sent nothing but a fresh nonce), and requests'
        connection errors when nothing answers."""
        client_nonce = new_nonce()
        response = self.http.post(
            f"{self.base_url}{CONTROL_PATH}{HELLO}", json={"client_nonce": client_nonce}, timeout=self.timeout
        )
        try:
            hello = response.json()
            session, server_nonce, instance = hello["session"], hello["server_nonce"], hello["instance"]
            proof = hello["proof"]
        except (ValueError, KeyError, TypeError):
            raise NoControlChannel(f"hello answered HTTP {response.status_code}: {response.text[:300]!r}") from None
        if not all(isinstance(value, str) for value in (session, server_nonce, instance, proof)):
            raise NoControlChannel(f"hello answered {response.text[:300]!r}")
        expected = server_proof(self._secret, client_nonce, server_nonce, session, instance)
        if not signatures_match(expected, proof):
            raise ServerNotProven(instance)
        self._session, self._key = session, session_key(self._secret, client_nonce, server_nonce, session)
        return instance

    def request(self, method: str, path: str, payload: dict | None = None) -> requests.Response:
        """Send `payload` (JSON) signed in this session; returns the answer once its signature is checked. Raises
        `UnsignedAnswer` (or `UnknownSession`) for an answer the server did not sign for this request."""
        body = b"" if payload is None else json.dumps(payload).encode()
        with self._counter_lock:
            counter = next(self._counters)
        signature = request_signature(self._key, method, path, counter, body)
        headers = {SESSION_HEADER: self._session, COUNTER_HEADER: str(counter), SIGNATURE_HEADER: signature}
        if payload is not None:
            headers["Content-Type"] = "application/json"
        response = self.http.request(
            method, f"{self.base_url}{path}", data=body, headers=headers, timeout=self.timeout
        )
        expected = answer_signature(self._key, signature, response.status_code, response.content)
        if signatures_match(expected, response.headers.get(SIGNATURE_HEADER)):
            return response
        if response.status_code == 401 and _reason(response) == "unknown_session":
            raise UnknownSession(response)
        raise UnsignedAnswer(response)


def _reason(response: requests.Response) -> str | None:
    try:
        answer = response.json()
    except ValueError:
        return None
    return answer.get("reason") if isinstance(answer, dict) else None
