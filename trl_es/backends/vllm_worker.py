"""The vLLM worker extension of the server backend: ES without weight traffic.

`trl-es vllm-serve` starts vLLM's OpenAI server with `--worker-extension-cls
trl_es.backends.vllm_worker.ESWorkerExtension`. The extension keeps a float32 master of the Hugging Face weights
inside the server and regenerates every member's noise there from its seed, so a training step sends a few scalars
(seeds, sigma, update coefficients) through the server's authenticated control channel (`vllm_control.py`), which
passes string arguments only. No NCCL group is needed, which is why this also works where TRL's weight sync cannot
(on CPU).

Each method runs in every worker of the server (one per tensor-parallel rank), together. The float32 master is
split between a tensor-parallel engine's workers as between the processes of a colocated one (`ShardedMasterWeights`:
each tensor on one owner, which computes its member values and updates and broadcasts them to the others), and each
worker writes whole tensors, letting vLLM's `load_weights` pick its shard. Each method returns `{"result": ...}`, or
`{"error": kind, "message": ...}` when it refuses (the kinds of `control_channel.ERROR_STATUS`). The first argument
of every method is the caller's session, which the control channel passes after checking the caller's signature: a
run answers only the session that started it, a run id is started once, and a refusal to another session tells
nothing about the run (issue 27: refusals echoed the run id and load number, and `es_init` with the same run id reset
its master).

Weights changed behind the trainer's back are caught: every load into the engine is numbered by a counter that never
goes back, and the engine fingerprinted right after it (`engine_fingerprint`); after each generation the trainer calls
`es_verify` with the load it expects the engine to hold, which checks both, so a member whose generation saw other
weights, whoever wrote them, never reaches an update.
"""

from __future__ import annotations

import functools
import json
import os
import time
from pathlib import Path

import torch

from .._version import __version__
from ..compat.vllm import served_model_path, worker_model, worker_tensor_parallel_group
from ..compat.vllm_cpu import keep_plain_linear_weights_on_cpu
from ..core.checkpoint import ES_STATE_DIR, META_FILE, es_state_files, load_optimizer_state
from ..core.consistency import engine_fingerprint, layout_free_stats
from ..core.direction_optimizer import DirectionOptimizer, DirectionOptimizerSettings
from ..core.master import MasterWeights
from ..core.noise import Member
from ..core.sharded_master import ShardedMasterWeights
from ..core.tensor_files import TensorFiles, read_master_share
from ..core.update_shards import EngineShards
from .control_channel import CHECKPOINT_DIR_ENV

# The extension module is imported by each worker before it loads the model: the place to fix vLLM-CPU's layers.
keep_plain_linear_weights_on_cpu()


class Refused(Exception):
    """A control call the worker will not carry out; `kind` is one of `control_channel.ERROR_STATUS`."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def control_call(method):
    """Wrap a worker method's result (or refusal) in the dict the control channel answers with."""

    @functools.wraps(method)
    def call(self, *args):
        try:
            return {"result": method(self, *args)}
        except Refused as refusal:
            return {"error": refusal.kind, "message": str(refusal)}

    return call


def _safetensors_in(path: Path) -> list[Path]:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path} holds no *.safetensors weights; the ES worker reads the master from them.")
    return files


def _served_checkpoint_files(model: str) -> list[Path]:
    """The served model's weights: its folder, or the Hub snapshot vLLM already downloaded (never downloaded here)."""
    path = Path(model)
    if not path.is_dir():
        from huggingface_hub import snapshot_download

        path = Path(snapshot_download(model, allow_patterns=["*.safetensors", "*.json"], local_files_only=True))
    return _safetensors_in(path)


def _resume_checkpoint(resume_from: str) -> Path:
    """The trainer's checkpoint folder, if it lies under the server's `--checkpoint_dir` (symlinks resolved)."""
    root = os.environ.get(CHECKPOINT_DIR_ENV)
    if not root:
        raise Refused(
            "checkpoint_refused",
            f"The trainer resumes from {resume_from}, but this server reads no checkpoints: it was started without "
            "--checkpoint_dir. Restart it with `trl-es vllm-serve ... --checkpoint_dir <the trainer's output_dir>`.",
        )
    real, real_root = os.path.realpath(resume_from), os.path.realpath(root)
    if not _lies_under(real, real_root) or not os.path.isdir(real):
        raise Refused(
            "checkpoint_refused",
            f"The trainer resumes from {resume_from}, which is not a folder under this server's --checkpoint_dir "
            f"{root}. Resume from a checkpoint under it, or restart the server with --checkpoint_dir set to the "
            "folder that holds the trainer's checkpoints (its output_dir). The server never downloads checkpoints.",
        )
    return _refuse_links_out(Path(real), real_root, root)


def _refuse_links_out(checkpoint: Path, real_root: str, root: str) -> Path:
    """`checkpoint`, once no file the worker reads from it is a link that leads out of `--checkpoint_dir` (issue 27:
    only the folder's path was resolved, so a file symlink inside it escaped)."""
    read = [*checkpoint.glob("*.safetensors"), *(checkpoint / ES_STATE_DIR).glob("*")]
    for file in read:
        real = os.path.realpath(file)
        if not _lies_under(real, real_root):
            raise Refused(
                "checkpoint_refused",
                f"{file} in the checkpoint the trainer resumes from leads to {real}, outside this server's "
                f"--checkpoint_dir {root}. Resume from a checkpoint whose files lie under it.",
            )
    return checkpoint


def _lies_under(real: str, real_root: str) -> bool:
    """Whether the resolved path `real` is `real_root` or inside it."""
    return os.path.commonpath([real, real_root]) == real_root


class ESWorkerExtension:
    """Methods that the trainer calls through the server's control channel. Arguments arrive as strings."""

    def _es_engine_fingerprint(self) -> dict:
        return engine_fingerprint(worker_model(self).named_parameters())

    def _es_runs(self) -> dict[str, dict]:
        """Every run started in this worker: its session, and when another run replaced it (None while it runs)."""
        if not hasattr(self, "_es_started_runs"):
            self._es_started_runs = {}
        return self._es_started_runs

    def _es_run(self, session: str, run_id: str) -> dict:
        """The state of run `run_id`, if it is the worker's current run and `session` started it."""
        state = getattr(self, "_es_state", None)
        if state is not None and state["run_id"] == run_id and state["session"] == session:
            state["last_call"] = time.monotonic()
            return state
        started = self._es_runs().get(run_id)
        if started is not None and started["session"] == session and started["replaced_at"] is not None:
            raise Refused(
                "run_replaced",
                f"Run {run_id} was replaced {time.monotonic() - started['replaced_at']:.0f} s ago by a run that "
                "another session holding this server's secret started.",
            )
        raise Refused("run_lost", f"This session holds no run {run_id!r} in this server.")

    def _es_load_count(self) -> int:
        """Loads into the engine since the server started, whichever run made them: never reset."""
        return getattr(self, "_es_loads", 0)

    def _es_check_unchanged(self, state: dict, expected_load: str, fingerprint: bool = True) -> None:
        """Refuse if the engine no longer holds load number `expected_load` (and, with `fingerprint`, exactly as it
        was written)."""
        if int(expected_load) != self._es_load_count():
            raise Refused(
                "weights_changed",
                f"The engine's weights were rewritten during the run: the trainer expects its load #{expected_load} "
                f"in place, but the engine holds load #{self._es_load_count()}.",
            )
        if not fingerprint:
            return
        now = self._es_engine_fingerprint()
        changed = [name for name, value in state["fingerprint"].items() if now.get(name) != value]
        if changed:
            raise Refused(
                "weights_changed",
                f"The engine's weights changed while it generated with {state['holds']} (load #{expected_load}) "
                f"without any control call: something inside the server rewrote {len(changed)} tensors, e.g. "
                f"{changed[:3]}.",
            )

    def _es_write(self, state: dict, named_tensors_in, holds: str) -> str:
        """Load `named_tensors_in(dtype=<the engine's>)` into the engine and record what it holds; returns the new
        load number. The master casts each tensor before it travels between the workers that split it."""
        worker_model(self).load_weights(named_tensors_in(dtype=next(worker_model(self).parameters()).dtype))
        self._es_loads = self._es_load_count() + 1
        state["holds"], state["fingerprint"] = holds, self._es_engine_fingerprint()
        return str(self._es_loads)

    @control_call
    def es_version(self, session: str) -> str:
        return __version__

    @control_call
    def es_init(
        self, session: str, run_id: str, names_json: str, trainer_dtype: str, sigma: str, resume_from: str = "",
        optimizer_json: str = "{}",
    ) -> dict:  # fmt: skip
        """Start a run: build the master of the evolving parameters `names_json` from the served checkpoint, rounded
        through the trainer's parameter dtype so both masters start equal; or, when the trainer resumes, from its
        checkpoint `resume_from` (weights plus the float32 masters and the `es_optimizer` state of `es_state/`),
        which must lie under the server's `--checkpoint_dir`. Members are perturbed with noise scale `sigma`;
        updates go through the optimizer of `optimizer_json` (`DirectionOptimizerSettings`' fields). A run in
        progress is replaced (its trainer is told at its next call); a run id is started once. Returns the master and
        optimizer digests, the load number, and how long the replaced run had been idle."""
        if run_id in self._es_runs():
            raise Refused(
                "bad_request",
                f"Run {run_id!r} was started in this server before: a run id starts one run only (the trainer draws "
                "a new one at every start and resume).",
            )
        names = json.loads(names_json)
        resumed = _resume_checkpoint(resume_from) if resume_from else None
        served = _served_checkpoint_files(served_model_path(self))
        weights = TensorFiles([*served, *(_safetensors_in(resumed) if resumed is not None else [])])
        missing = [name for name in names if name not in weights]
        if missing:
            raise KeyError(
                f"The served checkpoint has no tensors named {missing[:5]}: the server and the trainer must load the "
                "same model."
            )
        group = worker_tensor_parallel_group(self)
        shards = None if group is None else EngineShards(group, {name: weights.shapes[name] for name in names})
        masters = TensorFiles(es_state_files(resumed)[0]) if resumed is not None else None
        # A worker of a tensor-parallel engine reads only the tensors it owns (a 70B model on 8 workers: 1/8 each).
        evolving = read_master_share(weights, names, getattr(torch, trainer_dtype), shards, masters)
        previous = getattr(self, "_es_state", None)
        replaced = None
        if previous is not None:
            replaced = {"idle_seconds": time.monotonic() - previous["last_call"]}
            self._es_runs()[previous["run_id"]]["replaced_at"] = time.monotonic()
        device = next(worker_model(self).parameters()).device
        if shards is None:
            master = MasterWeights(evolving, float(sigma), device=device)
            # The frozen tensors feed only an unsplit master's prediction of the engine's statistics (`es_checksum`).
            frozen = list(weights.read(name for name in weights if name not in evolving).values())
        else:
            master, frozen = ShardedMasterWeights(evolving, float(sigma), shards, device=device), []
        master.optimizer = DirectionOptimizer(DirectionOptimizerSettings(**json.loads(optimizer_json)))
        if resumed is not None:
            metadata = json.loads((resumed / ES_STATE_DIR / META_FILE).read_text())
            master.restore_optimizer(load_optimizer_state(resumed), metadata)  # each worker reads its share
        state = dict(run_id=run_id, session=session, master=master, frozen=frozen, last_call=time.monotonic())
        self._es_runs()[run_id] = {"session": session, "replaced_at": None}
        self._es_state = state
        load = self._es_write(state, master.centre, "the centre")
        master_digest, optimizer_digest = master.digests()
        return dict(master_digest=master_digest, optimizer_digest=optimizer_digest, load=load, replaced=replaced)

    @control_call
    def es_load_member(self, session: str, run_id: str, expected_load: str, seed: str, sign: str, sigma: str) -> str:
        """Check that no other load followed load `expected_load`, then load member `(seed, sign)` at noise scale
        `sigma` (the trainer's for this step: a schedule or the adaptive sigma changes it); returns its load number."""
        state = self._es_run(session, run_id)
        self._es_check_unchanged(state, expected_load, fingerprint=False)  # `es_verify` checked it after generating
        member = Member(int(seed), int(sign))
        state["master"].sigma = float(sigma)
        return self._es_write(
            state, functools.partial(state["master"].perturbed, member), f"member (seed {seed}, sign {sign})"
        )

    @control_call
    def es_load_center(self, session: str, run_id: str, expected_load: str) -> str:
        """Check that no other load followed load `expected_load`, then load the centre; returns its load number."""
        state = self._es_run(session, run_id)
        self._es_check_unchanged(state, expected_load, fingerprint=False)
        return self._es_write(state, state["master"].centre, "the centre")

    @control_call
    def es_verify(self, session: str, run_id: str, expected_load: str) -> None:
        """After a generation: check that the engine still holds load `expected_load`, exactly as it was written."""
        self._es_check_unchanged(self._es_run(session, run_id), expected_load)

    @control_call
    def es_apply_update(self, session: str, run_id: str, coefficients_json: str, lr: str, weight_decay: str) -> None:
        coefficients = {int(seed): value for seed, value in json.loads(coefficients_json).items()}
        self._es_run(session, run_id)["master"].apply_update(coefficients, float(lr), float(weight_decay))

    @control_call
    def es_checksum(self, session: str, run_id: str, expected_load: str) -> dict:
        """The master and optimizer digests, the engine's layout-free statistics with what the master predicts for
        them (on a single worker: sums over shards do not add up to the model's), and how many master elements this
        worker holds (after checking that the engine still holds load `expected_load`)."""
        state = self._es_run(session, run_id)
        master = state["master"]
        # Collective: every worker digests before any may refuse below (one whose shards changed refuses alone).
        master_digest, optimizer_digest = master.digests()
        self._es_check_unchanged(state, expected_load)
        predicted = None
        if not isinstance(master, ShardedMasterWeights):
            engine_dtype = next(worker_model(self).parameters()).dtype
            predicted = list(layout_free_stats([*master.tensors.values(), *state["frozen"]], dtype=engine_dtype))
        return {
            "master_digest": master_digest,
            "optimizer_digest": optimizer_digest,
            "engine_stats": list(layout_free_stats(worker_model(self).parameters())),
            "predicted_engine_stats": predicted,
            "master_elements": sum(tensor.numel() for tensor in master.state_dict().values()),
            "pid": os.getpid(),
        }
