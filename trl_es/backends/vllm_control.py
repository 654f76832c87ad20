"""The ES control channel inside `trl-es vllm-serve`: an authenticating ASGI middleware in front of vLLM's app.

`trl-es vllm-serve` starts vLLM's OpenAI server (not in dev mode, so `/collective_rpc`, `/sleep`, `/reset_*` and the
other dev routes do not exist) with `--middleware trl_es.backends.vllm_control.ESControlMiddleware`. The middleware
speaks the protocol of `control_channel.py`: it proves to a trainer that it holds the secret (`hello`), checks the
signature and counter of every request made in a session, answers control calls itself (they never reach vLLM's
routes) and signs every answer to a signed request, vLLM's completions included. A control call runs only the ES
methods of the worker extension (`CONTROL_METHODS`), with string arguments, and always in the caller's session.
Requests without a session pass through to vLLM unchanged (the OpenAI-compatible endpoints stay open, as before).
"""

from __future__ import annotations

import json
import os
import secrets
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field

from ..compat.vllm import engine_client_of
from .control_channel import (
    CONTROL_METHODS,
    CONTROL_PATH,
    COUNTER_HEADER,
    ERROR_STATUS,
    HELLO,
    INSTANCE_ENV,
    NONCE_BYTES,
    SECRET_ENV,
    SECRET_FILE_ENV,
    SESSION_HEADER,
    SIGNATURE_HEADER,
    ReplayWindow,
    SecretError,
    answer_signature,
    env_secret,
    new_nonce,
    read_secret,
    request_signature,
    server_proof,
    session_key,
    signatures_match,
)

MAX_BODY_BYTES = 16 * 2**20  # an `es_init` names every evolving parameter; nothing legitimate comes near this
MAX_HELLO_BYTES = 1024
# Anyone can open a handshake, only a holder of the secret can use one: the two are bounded separately, so a flood of
# handshakes never drops a session in use.
MAX_OPEN_HANDSHAKES = 256
MAX_SESSIONS = 64


def server_secret() -> str:
    """The secret `trl-es vllm-serve` handed to this process (the value itself, or the file that holds it)."""
    secret = env_secret()
    if secret:
        return secret
    if os.environ.get(SECRET_FILE_ENV):
        return read_secret(os.environ[SECRET_FILE_ENV])
    raise SecretError(
        f"The trl-es control channel has no secret: start the server with `trl-es vllm-serve` (which writes one), or "
        f"set {SECRET_ENV} or {SECRET_FILE_ENV}."
    )


@dataclass
class Session:
    key: bytes
    counters: ReplayWindow = field(default_factory=ReplayWindow)


class Sessions:
    """The server's sessions by id: handshakes not used yet, and sessions a valid signed request has used (the least
    recently used is dropped first when either is full)."""

    def __init__(self, max_handshakes: int = MAX_OPEN_HANDSHAKES, max_sessions: int = MAX_SESSIONS):
        self.handshakes: OrderedDict[str, Session] = OrderedDict()
        self.used: OrderedDict[str, Session] = OrderedDict()
        self.max_handshakes, self.max_sessions = max_handshakes, max_sessions

    def open(self, session_id: str, key: bytes) -> None:
        self.handshakes[session_id] = Session(key)
        _bound(self.handshakes, self.max_handshakes)

    def get(self, session_id: str) -> Session | None:
        return self.used.get(session_id) or self.handshakes.get(session_id)

    def confirm(self, session_id: str) -> None:
        """The session has made a valid signed request: keep it among the used ones, as the most recent."""
        session = self.handshakes.pop(session_id, None) or self.used.pop(session_id)
        self.used[session_id] = session
        _bound(self.used, self.max_sessions)


def _bound(sessions: OrderedDict, size: int) -> None:
    while len(sessions) > size:
        sessions.popitem(last=False)


class ESControlMiddleware:
    """ASGI middleware serving the trl-es control protocol (`control_channel.py`) in front of vLLM's OpenAI app."""

    def __init__(self, app):
        import vllm.envs

        if vllm.envs.VLLM_SERVER_DEV_MODE:
            raise RuntimeError(
                "VLLM_SERVER_DEV_MODE is set: vLLM would serve /collective_rpc to anyone who reaches the port, beside "
                "the authenticated trl-es control channel. Unset it (trl-es vllm-serve does not need it)."
            )
        self.app = app
        self.secret = server_secret()
        self.instance = os.environ.get(INSTANCE_ENV) or uuid.uuid4().hex
        self.sessions = Sessions()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
        elif scope["path"] == CONTROL_PATH + HELLO:
            await _send_json(send, *await self._hello(scope, receive))
        elif _header(scope, SESSION_HEADER) is not None:
            await self._signed(scope, receive, send)
        elif scope["path"].startswith(CONTROL_PATH):
            await _send_json(send, *_refusal("unauthorized", "Control calls are made in a session: start with hello."))
        else:
            await self.app(scope, receive, send)

    async def _hello(self, scope, receive) -> tuple[int, dict]:
        """Open a session: prove the secret to the caller, bound to its fresh nonce."""
        try:
            client_nonce = json.loads(await _read_body(receive, MAX_HELLO_BYTES))["client_nonce"]
            valid = scope["method"] == "POST" and len(bytes.fromhex(client_nonce)) == NONCE_BYTES
        except (ValueError, KeyError, TypeError):
            valid = False
        if not valid:
            return _refusal("bad_request", f"hello takes POST {{'client_nonce': <{NONCE_BYTES} bytes in hex>}}.")
        session_id, server_nonce = secrets.token_hex(16), new_nonce()
        self.sessions.open(session_id, session_key(self.secret, client_nonce, server_nonce, session_id))
        proof = server_proof(self.secret, client_nonce, server_nonce, session_id, self.instance)
        return 200, {"session": session_id, "server_nonce": server_nonce, "instance": self.instance, "proof": proof}

    async def _signed(self, scope, receive, send) -> None:
        """A request made in a session: checked, answered (by the control channel or by vLLM), and the answer signed.
        Refusals before the signature is checked are unsigned and say nothing about the server's state."""
        session_id = _header(scope, SESSION_HEADER)
        try:
            body = await _read_body(receive, MAX_BODY_BYTES)
            counter = int(_header(scope, COUNTER_HEADER) or "")
        except ValueError:
            await _send_json(send, *_refusal("bad_request", "A signed request needs a counter and a body under "
                                                            f"{MAX_BODY_BYTES} bytes."))  # fmt: skip
            return
        session = self.sessions.get(session_id)
        if session is None:
            # A restarted server knows no session of the old one: the trainer tells that apart by a new hello.
            status, answer = _refusal("unauthorized", "No such session: open one with hello.")
            await _send_json(send, status, {**answer, "reason": "unknown_session"})
            return
        presented = _header(scope, SIGNATURE_HEADER)
        signature = request_signature(session.key, scope["method"], _path(scope), counter, body)
        if not signatures_match(signature, presented):
            await _send_json(send, *_refusal("unauthorized", "The request's signature does not match its session."))
            return
        if not session.counters.accept(counter):
            await _send_json(send, *_refusal("unauthorized", f"Counter {counter} was used already: a replay."))
            return
        self.sessions.confirm(session_id)
        if scope["path"].startswith(CONTROL_PATH):
            status, answer = await self._control(scope, session_id, body)
            status, headers, answer_body = status, [], json.dumps({**answer, "instance": self.instance}).encode()
        else:
            status, headers, answer_body = await _run_app(self.app, scope, body, receive)
        signed = answer_signature(session.key, signature, status, answer_body)
        await _send(send, status, [*headers, (SIGNATURE_HEADER.encode(), signed.encode())], answer_body)

    async def _control(self, scope, session_id: str, body: bytes) -> tuple[int, dict]:
        method = scope["path"].removeprefix(CONTROL_PATH)
        if scope["method"] != "POST" or method not in CONTROL_METHODS:
            return _refusal("bad_request", f"No control call {scope['method']} {method!r}; known: {CONTROL_METHODS}.")
        try:
            args = json.loads(body)["args"]
        except (ValueError, KeyError, TypeError) as error:
            return _refusal("bad_request", f"The body must be JSON {{'args': [str, ...]}} ({error}).")
        if not isinstance(args, list) or not all(isinstance(arg, str) for arg in args):
            return _refusal("bad_request", "Control call arguments must be a list of strings.")
        try:
            # The session goes first: the worker runs a call only in the session that started its run.
            answers = await engine_client_of(scope["app"]).collective_rpc(method, args=(session_id, *args))
        except Exception as error:  # the engine's own failure: report it, as vLLM's routes do
            return 500, {"error": "server_error", "message": f"{type(error).__name__}: {error}"}
        refusals = [answer for answer in answers if "error" in answer]
        if refusals:
            return ERROR_STATUS[refusals[0]["error"]], refusals[0]
        return 200, {"results": [answer["result"] for answer in answers]}


def _header(scope, name: str) -> str | None:
    """The value of header `name`, or None when it is missing or given more than once."""
    values = [value for key, value in scope["headers"] if key == name.encode()]
    return values[0].decode("latin-1") if len(values) == 1 else None


def _path(scope) -> str:
    """The path the trainer signed, with the query string if any."""
    query = scope.get("query_string", b"").decode("latin-1")
    return f"{scope['path']}?{query}" if query else scope["path"]


def _refusal(kind: str, message: str) -> tuple[int, dict]:
    return ERROR_STATUS[kind], {"error": kind, "message": message}


async def _read_body(receive, limit: int) -> bytes:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if len(body) > limit:
            raise ValueError(f"body over {limit} bytes")
        if not message.get("more_body", False):
            return body


async def _run_app(app, scope, body: bytes, receive) -> tuple[int, list, bytes]:
    """vLLM's answer to a request whose body was read already: its status, headers (but the length) and whole body."""
    delivered = []

    async def receive_body():
        if not delivered:
            delivered.append(True)
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # after the body: the client's disconnect, as the app would see it

    start, chunks = {}, []

    async def keep(message):
        if message["type"] == "http.response.start":
            start.update(message)
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive_body, keep)
    headers = [(key, value) for key, value in start.get("headers", []) if key.lower() != b"content-length"]
    return start.get("status", 500), headers, b"".join(chunks)


async def _send_json(send, status: int, answer: dict) -> None:
    await _send(send, status, [(b"content-type", b"application/json")], json.dumps(answer).encode())


async def _send(send, status: int, headers: list, body: bytes) -> None:
    headers = [*headers, (b"content-length", str(len(body)).encode())]
    if not any(key.lower() == b"content-type" for key, _ in headers):
        headers.append((b"content-type", b"application/json"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
