"""vLLM server backend: members live inside a `trl-es vllm-serve` server; only seeds and scalars travel.

The trainer keeps its own float32 master (for checkpoints) and the server keeps one too (in the worker extension,
`vllm_worker.py`). Both apply the same update from the same coefficients, and their digests are compared at the start
and every `consistency_check_steps` steps, so an unreachable, foreign or restarted server is a clear error rather
than a silent divergence.
"""

from __future__ import annotations

import json
import os
import uuid
from concurrent.futures import ThreadPoolExecutor

import requests

from ..core.consistency import master_digest, stats_agree
from ..core.master import MasterWeights
from ..core.noise import Member
from .base import OneMemberAtATime
from .sampling import SamplingSettings

SERVE_HINT = "Start one with `trl-es vllm-serve --model <the same model>` (see `trl-es vllm-serve --help`)."


class VLLMServerError(RuntimeError):
    """The vLLM server cannot be used for this ES run."""


class VLLMServerUnreachable(VLLMServerError):
    """Nothing answers at the server's address."""


class VLLMServerBackend(OneMemberAtATime):
    """Generation and member weights in a remote `trl-es vllm-serve` server.

    Args:
        base_url (`str`): The server, e.g. `http://127.0.0.1:8000`.
        master ([`MasterWeights`]): The trainer's float32 master, which the server's must equal.
        timeout (`float`): Seconds to wait for one request.
    """

    def __init__(self, base_url: str, master: MasterWeights, timeout: float = 600):
        self.base_url = base_url.rstrip("/")
        self.master = master
        self.timeout = timeout
        self.session = requests.Session()
        self.run_id = uuid.uuid4().hex
        self.weights_tag = self.run_id
        self.served_model = self._served_model()

    # HTTP -----------------------------------------------------------------------------------------------------

    def _request(self, method: str, path: str, payload: dict | None = None) -> requests.Response:
        try:
            response = self.session.request(method, f"{self.base_url}{path}", json=payload, timeout=self.timeout)
        except requests.ConnectionError as error:
            raise VLLMServerUnreachable(f"No vLLM server answers at {self.base_url}. {SERVE_HINT}") from error
        if response.status_code == 404 and path == "/collective_rpc":
            raise VLLMServerError(
                f"The vLLM server at {self.base_url} has no /collective_rpc endpoint: it was not started in dev mode "
                f"with the trl-es worker extension. {SERVE_HINT}"
            )
        if not response.ok:
            raise VLLMServerError(
                f"The vLLM server at {self.base_url} answered {path} with {response.status_code}: "
                f"{response.text[:1000]}"
            )
        return response

    def _served_model(self) -> str:
        return self._request("GET", "/v1/models").json()["data"][0]["id"]

    def _rpc(self, method: str, *args) -> list:
        """Call `method` of the worker extension in every worker of the server; returns one result per worker."""
        payload = {"method": method, "args": [str(arg) for arg in args], "timeout": self.timeout}
        try:
            return self._request("POST", "/collective_rpc", payload).json()["results"]
        except VLLMServerError as error:
            if "holds no ES run" in str(error):
                raise VLLMServerError(
                    f"The vLLM server at {self.base_url} lost this run's weights (restarted, or taken over by "
                    "another trainer). Restart training from the last checkpoint."
                ) from error
            raise

    # Backend ----------------------------------------------------------------------------------------------------

    def start_run(self, parameter_dtype: str, checkpoint: str | None = None) -> None:
        """Check that the server runs the trl-es extension, create this run's master in it and check that it equals
        the trainer's."""
        try:
            self._rpc("es_version")
        except VLLMServerUnreachable:
            raise
        except VLLMServerError as error:
            raise VLLMServerError(
                f"The vLLM server at {self.base_url} does not run the trl-es worker extension ({error}). {SERVE_HINT}"
            ) from error
        names = json.dumps(list(self.master.tensors))
        # A resumed run's master is in its checkpoint, which the server reads (it must see the same filesystem).
        resume_from = os.path.abspath(checkpoint) if checkpoint else ""
        sigma = repr(float(self.master.sigma))
        digests = set(self._rpc("es_init", self.run_id, names, parameter_dtype, sigma, resume_from))
        self.weights_tag = uuid.uuid4().hex
        expected = master_digest(self.master.tensors)
        if digests != {expected}:
            raise VLLMServerError(
                f"The vLLM server at {self.base_url} starts from other weights than the trainer (master digests "
                f"{sorted(digests)} vs {expected}). Serve the same checkpoint the trainer loads, and load it in the "
                "trainer without modifying it; when resuming, the server must be able to read the checkpoint "
                f"{checkpoint!r}."
            )

    def load_member(self, member: Member) -> None:
        self._rpc("es_load_member", self.run_id, member.seed, member.sign)
        self.weights_tag = uuid.uuid4().hex

    def load_center(self) -> None:
        self._rpc("es_load_center", self.run_id)
        self.weights_tag = uuid.uuid4().hex

    def after_update(self, coefficients: dict[int, float], lr: float, weight_decay: float) -> None:
        # JSON floats round-trip exactly, so the server applies bit-for-bit the trainer's update.
        self._rpc("es_apply_update", self.run_id, json.dumps(coefficients), repr(float(lr)), repr(float(weight_decay)))
        self.load_center()

    def generate_center(self, prompt_ids: list[list[int]], sampling: SamplingSettings, seed: int | None):
        """Completions with the weights the server holds (the centre, between calls)."""

        def complete(row: int) -> list[int]:
            payload = {
                "model": self.served_model,
                "prompt": prompt_ids[row],
                "return_token_ids": True,
                "cache_salt": self.weights_tag,  # no KV block computed under other weights can match
                **sampling.vllm_params(seed, row),
            }
            return list(self._request("POST", "/v1/completions", payload).json()["choices"][0]["token_ids"])

        # One request per row (each row has its own seed); concurrent, so the server batches them.
        with ThreadPoolExecutor(max_workers=min(64, max(1, len(prompt_ids)))) as pool:
            return list(pool.map(complete, range(len(prompt_ids))))

    def check_consistency(self, step: int) -> None:
        expected = master_digest(self.master.tensors)
        reports = self._rpc("es_checksum", self.run_id)
        for report in reports:
            if report["master_digest"] != expected:
                raise VLLMServerError(
                    f"At step {step} the vLLM server's master differs from the trainer's (digest "
                    f"{report['master_digest']} vs {expected}): the server's generations no longer follow the run."
                )
        # Layout-free statistics only sum up to the whole model on a single (non-sharded) worker.
        if len(reports) == 1 and not stats_agree(reports[0]["engine_stats"], reports[0]["predicted_engine_stats"]):
            raise VLLMServerError(
                f"At step {step} the vLLM server's engine does not hold its master's weights "
                f"({reports[0]['engine_stats']} vs {reports[0]['predicted_engine_stats']})."
            )
