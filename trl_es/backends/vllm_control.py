"""The ES control channel inside `trl-es vllm-serve`: an authenticated ASGI middleware in front of vLLM's app.

`trl-es vllm-serve` starts vLLM's OpenAI server (not in dev mode, so `/collective_rpc`, `/sleep`, `/reset_*` and the
other dev routes do not exist) with `--middleware trl_es.backends.vllm_control.ESControlMiddleware`. Requests under
`CONTROL_PATH` are answered here and never reach vLLM's routes: the caller must present the server's secret
(compared in constant time), and may only run the ES methods of the worker extension (`CONTROL_METHODS`), with
string arguments. Every other request (the OpenAI-compatible generation endpoints, `/health`) passes through unchanged.
Every answer of the channel carries the server's instance id, so a trainer tells a restarted server from a refusal.
"""

from __future__ import annotations

import hmac
import json
import os
import uuid

from ..compat.vllm import engine_client_of
from .control_channel import (
    CONTROL_METHODS,
    CONTROL_PATH,
    ERROR_STATUS,
    INSTANCE_ENV,
    SECRET_ENV,
    SECRET_FILE_ENV,
    SecretError,
    env_secret,
    read_secret,
)

MAX_BODY_BYTES = 16 * 2**20  # an `es_init` names every evolving parameter; nothing legitimate comes near this


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


class ESControlMiddleware:
    """ASGI middleware serving `POST CONTROL_PATH + <method>` with body `{"args": [str, ...]}` to callers that send
    `Authorization: Bearer <secret>`; answers `{"results": [one per worker], "instance": ...}` or
    `{"error": kind, "message": ..., "instance": ...}`."""

    def __init__(self, app):
        import vllm.envs

        if vllm.envs.VLLM_SERVER_DEV_MODE:
            raise RuntimeError(
                "VLLM_SERVER_DEV_MODE is set: vLLM would serve /collective_rpc to anyone who reaches the port, beside "
                "the authenticated trl-es control channel. Unset it (trl-es vllm-serve does not need it)."
            )
        self.app = app
        self.secret = f"Bearer {server_secret()}".encode()
        self.instance = os.environ.get(INSTANCE_ENV) or uuid.uuid4().hex

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].startswith(CONTROL_PATH):
            await self.app(scope, receive, send)
            return
        status, body = await self._answer(scope, receive)
        payload = json.dumps({**body, "instance": self.instance}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    def _authorized(self, scope) -> bool:
        presented = [value for name, value in scope["headers"] if name == b"authorization"]
        # Constant time, so the answer's timing tells nothing about how much of a guess was right.
        return len(presented) == 1 and hmac.compare_digest(presented[0], self.secret)

    async def _answer(self, scope, receive) -> tuple[int, dict]:
        if not self._authorized(scope):
            return _refusal("unauthorized", "This control call needs the server's secret (Authorization: Bearer).")
        method = scope["path"].removeprefix(CONTROL_PATH)
        if scope["method"] != "POST" or method not in CONTROL_METHODS:
            return _refusal("bad_request", f"No control call {scope['method']} {method!r}; known: {CONTROL_METHODS}.")
        try:
            args = json.loads(await _read_body(receive))["args"]
        except (ValueError, KeyError, TypeError) as error:
            return _refusal("bad_request", f"The body must be JSON {{'args': [str, ...]}} ({error}).")
        if not isinstance(args, list) or not all(isinstance(arg, str) for arg in args):
            return _refusal("bad_request", "Control call arguments must be a list of strings.")
        try:
            answers = await engine_client_of(scope["app"]).collective_rpc(method, args=tuple(args))
        except Exception as error:  # the engine's own failure: report it, as vLLM's routes do
            return 500, {"error": "server_error", "message": f"{type(error).__name__}: {error}"}
        refusals = [answer for answer in answers if "error" in answer]
        if refusals:
            return ERROR_STATUS[refusals[0]["error"]], refusals[0]
        return 200, {"results": [answer["result"] for answer in answers]}


def _refusal(kind: str, message: str) -> tuple[int, dict]:
    return ERROR_STATUS[kind], {"error": kind, "message": message}


async def _read_body(receive) -> bytes:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if len(body) > MAX_BODY_BYTES:
            raise ValueError(f"body over {MAX_BODY_BYTES} bytes")
        if not message.get("more_body", False):
            return body
