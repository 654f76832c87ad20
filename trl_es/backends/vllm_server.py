"""vLLM server backend: members live inside a `trl-es vllm-serve` server; only seeds and scalars travel.

The trainer keeps its own float32 master (for checkpoints) and the server keeps one too (in the worker extension,
`vllm_worker.py`). Both apply the same update from the same coefficients, and their digests are compared at the start
and every `consistency_check_steps` steps. Every request goes through a session of the server's control channel
(`control_client.py`): the server proves it holds the secret before anything else is sent, and every answer,
completions included, is signed for its request. Each load names the load it expects the engine to still hold, so
weights changed during a member's generation are caught before its fitness is used. An impostor on the port, a
killed, restarted, foreign or taken-over server is an error that says which.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import NoReturn
from urllib.parse import urlparse

import requests

from ..core.consistency import stats_agree
from ..core.master import MasterWeights
from ..core.noise import Member
from .base import OneMemberAtATime
from .control_channel import CONTROL_PATH, trainer_secret
from .control_client import ControlSession, NoControlChannel, ServerNotProven, UnknownSession, UnsignedAnswer
from .sampling import SamplingSettings, row_seeds

logger = logging.getLogger(__name__)

SERVE_HINT = "Start one with `trl-es vllm-serve --model <the same model>` (see `trl-es vllm-serve --help`)."
RESUME_HINT = "Restart `trl-es vllm-serve` if needed and resume training from the last checkpoint."


class VLLMServerError(RuntimeError):
    """The vLLM server cannot be used for this ES run."""


class VLLMServerNotProven(VLLMServerError):
    """The process answering at the server's address could not prove that it holds the control secret."""


class VLLMServerUnreachable(VLLMServerError):
    """Nothing answers at the server's address."""


class VLLMServerStopped(VLLMServerUnreachable):
    """The server answered earlier in the run and no longer does: it was killed or crashed."""


class VLLMServerRestarted(VLLMServerError):
    """Another server process answers at the address: the run's weights in the server are gone."""


class VLLMServerTakenOver(VLLMServerError):
    """Another trainer started its own run in the server."""


class VLLMServerWeightsChanged(VLLMServerError):
    """The engine's weights changed while it generated for this run."""


class VLLMServerBackend(OneMemberAtATime):
    """Generation and member weights in a remote `trl-es vllm-serve` server.

    Args:
        base_url (`str`): The server, e.g. `http://127.0.0.1:8000`.
        master ([`MasterWeights`]): The trainer's float32 master, which the server's must equal.
        timeout (`float`): Seconds to wait for one request.
        secret_file (`str`, *optional*): The file holding the server's control secret; default:
            `TRL_ES_SERVER_SECRET`, else the file `trl-es vllm-serve` writes for the server's port.
    """

    def __init__(self, base_url: str, master: MasterWeights, timeout: float = 600, secret_file: str | None = None):
        self.base_url = base_url.rstrip("/")
        self.master = master
        self.timeout = timeout
        self.run_id = uuid.uuid4().hex
        self.weights_tag = self.run_id
        self.load = "0"  # the number of the last load this run made in the engine
        self._secret, self.secret_source = trainer_secret(secret_file, urlparse(self.base_url).port or 8000)
        self.channel = ControlSession(self.base_url, self._secret, timeout)
        self.instance = self._open_session(self.channel)  # the server process that holds this run's session
        self.served_model = self._served_model()

    # HTTP -----------------------------------------------------------------------------------------------------

    def _open_session(self, channel: ControlSession) -> str:
        """Open `channel`'s session; returns the instance id of the server that proved it holds the secret."""
        try:
            return channel.open()
        except (requests.ConnectionError, requests.Timeout) as error:
            raise VLLMServerUnreachable(f"No vLLM server answers at {self.base_url}. {SERVE_HINT}") from error
        except NoControlChannel as error:
            raise VLLMServerError(
                f"The server at {self.base_url} has no trl-es control channel ({error}): it is not a `trl-es "
                f"vllm-serve` server, so it does not run the trl-es worker extension. {SERVE_HINT}"
            ) from None
        except ServerNotProven:
            port = urlparse(self.base_url).port or 8000
            raise VLLMServerNotProven(
                f"The server at {self.base_url} could not prove that it holds the control secret from "
                f"{self.secret_source}; nothing it could learn the secret from was sent. Either the secret is not "
                "this server's (point `vllm_server_secret_file` to the file `trl-es vllm-serve` printed at start, or "
                f"set TRL_ES_SERVER_SECRET to the same value for both), or another process answers on port {port} "
                f"in its place (see who listens there: `ss -ltnp 'sport = :{port}'`)."
            ) from None

    def _request(self, method: str, path: str, payload: dict | None = None) -> requests.Response:
        """`method path` in this run's session: an answer the server signed for it, whatever its status."""
        try:
            return self.channel.request(method, path, payload)
        except (requests.ConnectionError, requests.exceptions.ChunkedEncodingError) as error:
            raise VLLMServerStopped(
                f"The vLLM server at {self.base_url} stopped answering during the run ({method} {path}): it was "
                f"killed or crashed, and this run's weights in it are gone. {RESUME_HINT}"
            ) from error
        except UnknownSession:
            self._session_lost(method, path)
        except UnsignedAnswer as error:
            raise VLLMServerError(
                f"The answer to {method} {path} from {self.base_url} is not signed for this run's session "
                f"({error}): it does not come from the server that proved it holds the secret. Another process "
                "answers on the port or in between; stop it and resume from the last checkpoint."
            ) from None

    def _session_lost(self, method: str, path: str) -> NoReturn:
        """The server says it knows no session of this run's: a new handshake tells a restart from the rest."""
        try:
            instance = self._open_session(ControlSession(self.base_url, self._secret, self.timeout))
        except VLLMServerUnreachable as error:
            raise VLLMServerStopped(
                f"The vLLM server at {self.base_url} stopped answering during the run ({method} {path}). {RESUME_HINT}"
            ) from error
        if instance != self.instance:
            raise VLLMServerRestarted(
                f"The vLLM server at {self.base_url} was restarted during the run (server instance {self.instance} "
                f"is now {instance}): the new process does not hold this run's weights. {RESUME_HINT}"
            )
        raise VLLMServerError(
            f"The vLLM server at {self.base_url} dropped this run's session ({method} {path}): it keeps the latest "
            "sessions only, and others opened many since. Give each trainer its own server, and resume from the "
            "last checkpoint."
        )

    def _served_model(self) -> str:
        response = self._request("GET", "/v1/models")
        if not response.ok:
            raise VLLMServerError(
                f"The vLLM server at {self.base_url} answered /v1/models with {response.status_code}"
            )
        return response.json()["data"][0]["id"]

    def _control(self, method: str, *args) -> list:
        """Run `method` of the worker extension in every worker of the server; returns one result per worker."""
        response = self._request("POST", f"{CONTROL_PATH}{method}", {"args": [str(arg) for arg in args]})
        answer = response.json()
        if answer.get("instance") != self.instance:  # signed by this session's key, so only a bug gets here
            raise VLLMServerRestarted(f"The vLLM server at {self.base_url} answers as another instance. {RESUME_HINT}")
        if response.ok:
            return answer["results"]
        error, message = answer.get("error"), answer.get("message", response.text[:1000])
        if error == "run_replaced":
            raise VLLMServerTakenOver(
                f"The vLLM server at {self.base_url} was taken over by another trainer: {message} The server's "
                f"weights no longer follow this run {self.run_id}. Give each trainer its own server (port), and "
                "resume from the last checkpoint."
            )
        if error == "run_lost":
            raise VLLMServerError(
                f"The vLLM server at {self.base_url} lost this run's weights ({message}). {RESUME_HINT}"
            )
        if error == "weights_changed":
            raise VLLMServerWeightsChanged(
                f"The vLLM server at {self.base_url} changed the engine's weights behind the trainer's back: "
                f"{message} The completions of that generation are not this run's; stop whatever else drives the "
                f"server and resume from the last checkpoint."
            )
        raise VLLMServerError(
            f"The vLLM server at {self.base_url} answered {method} with {response.status_code}: {message}"
        )

    # Backend ----------------------------------------------------------------------------------------------------

    def start_run(
        self, parameter_dtype: str, checkpoint: str | None = None, expected: tuple[str, str] | None = None
    ) -> None:
        """Check that the server runs the trl-es extension, create this run's master in it and check that it equals
        the trainer's (`expected`: the trainer master's `digests()`, computed once for all of a process's servers,
        as it is collective where the processes split the master)."""
        self._control("es_version")
        names = json.dumps(self.master.names())
        # A resumed run's master is in its checkpoint, which the server reads (it must see the same filesystem).
        resume_from = os.path.abspath(checkpoint) if checkpoint else ""
        sigma = repr(float(self.master.sigma))
        optimizer = json.dumps(dataclasses.asdict(self.master.optimizer.settings))
        started = self._control("es_init", self.run_id, names, parameter_dtype, sigma, resume_from, optimizer)
        self.load = started[0]["load"]
        self.weights_tag = uuid.uuid4().hex
        replaced = started[0]["replaced"]
        if replaced:
            logger.warning(
                f"The vLLM server at {self.base_url} was running another ES run (last call "
                f"{replaced['idle_seconds']:.0f} s ago); this trainer took it over, and that run's trainer stops at "
                "its next call."
            )
        expected, expected_optimizer = expected or self.master.digests()
        digests = {result["master_digest"] for result in started}
        if digests != {expected}:
            raise VLLMServerError(
                f"The vLLM server at {self.base_url} starts from other weights than the trainer (master digests "
                f"{sorted(digests)} vs {expected}). Serve the same checkpoint the trainer loads, and load it in the "
                "trainer without modifying it; when resuming, the server must be able to read the checkpoint "
                f"{checkpoint!r}."
            )
        digests = {result["optimizer_digest"] for result in started}
        if digests != {expected_optimizer}:
            raise VLLMServerError(
                f"The vLLM server at {self.base_url} holds another es_optimizer state than the trainer "
                f"({sorted(digests)} vs {expected_optimizer}): when resuming, the server must read the same "
                f"checkpoint {checkpoint!r}."
            )

    def load_member(self, member: Member) -> None:
        sigma = repr(float(self.master.sigma))  # this step's: the server's master follows the trainer's
        [self.load] = set(self._control("es_load_member", self.run_id, self.load, member.seed, member.sign, sigma))
        self.weights_tag = uuid.uuid4().hex

    def load_center(self) -> None:
        [self.load] = set(self._control("es_load_center", self.run_id, self.load))
        self.weights_tag = uuid.uuid4().hex

    def after_update(self, coefficients: dict[int, float], lr: float, weight_decay: float) -> None:
        # JSON floats round-trip exactly, so the server applies bit-for-bit the trainer's update.
        self._control(
            "es_apply_update", self.run_id, json.dumps(coefficients), repr(float(lr)), repr(float(weight_decay))
        )
        self.load_center()

    def generate_center(self, prompt_ids: list[list[int]], sampling: SamplingSettings, seed: int | None):
        """Completions with the weights the server holds (the centre, or the member `load_member` loaded), checked
        afterwards to be exactly the weights this run loaded last."""
        return self.generate_loaded_rows(prompt_ids, row_seeds(seed, len(prompt_ids)), sampling)

    def generate_loaded_rows(
        self, prompt_ids: list[list[int]], seeds: list[int | None], sampling: SamplingSettings
    ) -> list[list[int]]:
        """As `generate_center`, row `i` sampled with `seeds[i]` (each request carries its own seed)."""

        def complete(row: int) -> list[int]:
            payload = {
                "model": self.served_model,
                "prompt": prompt_ids[row],
                "return_token_ids": True,
                "cache_salt": self.weights_tag,  # no KV block computed under other weights can match
                **sampling.vllm_row_params(seeds[row]),
            }
            response = self._request("POST", "/v1/completions", payload)
            if not response.ok:
                raise VLLMServerError(
                    f"The vLLM server at {self.base_url} answered /v1/completions with {response.status_code}: "
                    f"{response.text[:1000]}"
                )
            return list(response.json()["choices"][0]["token_ids"])

        # One request per row (each row has its own seed); concurrent, so the server batches them.
        with ThreadPoolExecutor(max_workers=min(64, max(1, len(prompt_ids)))) as pool:
            completions = list(pool.map(complete, range(len(prompt_ids))))
        self._control("es_verify", self.run_id, self.load)  # nothing rewrote the weights while they generated
        return completions

    def check_consistency(self, step: int, expected: tuple[str, str] | None = None) -> None:
        """Fail loudly if the server's master or engine left the trainer's (`expected`: as in `start_run`)."""
        expected, expected_optimizer = expected or self.master.digests()  # once, whatever the number of workers
        reports = self._control("es_checksum", self.run_id, self.load)
        for report in reports:
            if report["master_digest"] != expected:
                raise VLLMServerError(
                    f"At step {step} the vLLM server's master differs from the trainer's (digest "
                    f"{report['master_digest']} vs {expected}): the server's generations no longer follow the run. "
                    "Something changed one of them outside the run's updates: the server's master, or, where the "
                    "training processes split the master, one process's share (code that wrote into "
                    "`trainer.population.master`)."
                )
            if report["optimizer_digest"] != expected_optimizer:
                raise VLLMServerError(
                    f"At step {step} the vLLM server's es_optimizer state differs from the trainer's: its next "
                    "updates would not be the trainer's."
                )
        # Layout-free statistics only sum up to the whole model on a single (non-sharded) worker.
        if len(reports) == 1 and not stats_agree(reports[0]["engine_stats"], reports[0]["predicted_engine_stats"]):
            raise VLLMServerError(
                f"At step {step} the vLLM server's engine does not hold its master's weights "
                f"({reports[0]['engine_stats']} vs {reports[0]['predicted_engine_stats']})."
            )
