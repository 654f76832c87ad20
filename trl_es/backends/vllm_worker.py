"""The vLLM worker extension of the server backend: ES without weight traffic.

`trl-es vllm-serve` starts vLLM's OpenAI server with `--worker-extension-cls
trl_es.backends.vllm_worker.ESWorkerExtension`. The extension keeps a float32 master of the Hugging Face weights
inside the server and regenerates every member's noise there from its seed, so a training step sends a few scalars
(seeds, sigma, update coefficients) through vLLM's dev-mode `/collective_rpc`, which passes string arguments only.
No NCCL group is needed, which is why this also works where TRL's weight sync cannot (on CPU).

Each method runs in every worker of the server (one per tensor-parallel rank); each keeps its own master and lets
vLLM's `load_weights` pick its shard.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file

from ..core.checkpoint import ES_STATE_DIR, MASTER_FILE
from ..core.consistency import layout_free_stats, master_digest
from ..core.master import MasterWeights
from ..core.noise import Member
from .vllm_cpu import keep_plain_linear_weights_on_cpu

# The extension module is imported by each worker before it loads the model: the place to fix vLLM-CPU's layers.
keep_plain_linear_weights_on_cpu()


def _checkpoint_files(model: str) -> list[Path]:
    path = Path(model)
    if not path.is_dir():
        from huggingface_hub import snapshot_download

        path = Path(snapshot_download(model, allow_patterns=["*.safetensors", "*.json"]))
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path} holds no *.safetensors weights; the ES worker reads the master from them.")
    return files


def _read_checkpoint(model: str) -> dict[str, torch.Tensor]:
    tensors = {}
    for file in _checkpoint_files(model):
        tensors.update(load_file(file))
    return tensors


class ESWorkerExtension:
    """Methods that the trainer calls through `/collective_rpc`. Arguments arrive as strings."""

    def _es_model(self):
        return self.model_runner.model

    def _es_run(self, run_id: str) -> dict:
        state = getattr(self, "_es_state", None)
        if state is None or state["run_id"] != run_id:
            raise RuntimeError(
                f"This vLLM server holds no ES run {run_id!r}: it was restarted, or another trainer took it over. "
                "Its weights no longer follow the run; restart the training from its last checkpoint."
            )
        return state

    def _es_load(self, named_tensors) -> None:
        dtype = next(self._es_model().parameters()).dtype
        self._es_model().load_weights((name, tensor.to(dtype)) for name, tensor in named_tensors)

    def es_version(self) -> str:
        from .. import __version__

        return __version__

    def es_init(self, run_id: str, names_json: str, trainer_dtype: str, sigma: str, resume_from: str = "") -> str:
        """Start a run: build the master of the evolving parameters `names_json` from the served checkpoint, rounded
        through the trainer's parameter dtype so both masters start equal; or, when the trainer resumes, from its
        checkpoint `resume_from` (weights plus the float32 masters of `es_state/`). Members are perturbed with noise
        scale `sigma`. Returns the master digest."""
        names = json.loads(names_json)
        dtype = getattr(torch, trainer_dtype)
        checkpoint = _read_checkpoint(self.vllm_config.model_config.model)
        if resume_from:
            checkpoint.update(_read_checkpoint(resume_from))
        missing = [name for name in names if name not in checkpoint]
        if missing:
            raise KeyError(
                f"The served checkpoint has no tensors named {missing[:5]}: the server and the trainer must load the "
                "same model."
            )
        device = next(self._es_model().parameters()).device
        evolving = {name: checkpoint[name].to(device=device, dtype=dtype) for name in names}
        frozen = [tensor for name, tensor in checkpoint.items() if name not in evolving]
        if resume_from:
            evolving.update(load_file(Path(resume_from) / ES_STATE_DIR / MASTER_FILE, device=str(device)))
        self._es_state = {"run_id": run_id, "master": MasterWeights(evolving, float(sigma)), "frozen": frozen}
        self._es_load(self._es_state["master"].tensors.items())
        return master_digest(self._es_state["master"].tensors)

    def es_load_member(self, run_id: str, seed: str, sign: str) -> None:
        master = self._es_run(run_id)["master"]
        self._es_load(master.perturbed(Member(int(seed), int(sign))))

    def es_load_center(self, run_id: str) -> None:
        self._es_load(self._es_run(run_id)["master"].tensors.items())

    def es_apply_update(self, run_id: str, coefficients_json: str, lr: str, weight_decay: str) -> None:
        coefficients = {int(seed): value for seed, value in json.loads(coefficients_json).items()}
        self._es_run(run_id)["master"].apply_update(coefficients, float(lr), float(weight_decay))

    def es_checksum(self, run_id: str) -> dict:
        """The master digest, and the engine's layout-free statistics with what the master predicts for them."""
        state = self._es_run(run_id)
        engine_dtype = next(self._es_model().parameters()).dtype
        masters = state["master"].tensors.values()
        predicted = layout_free_stats([*masters, *state["frozen"]], dtype=engine_dtype)
        return {
            "master_digest": master_digest(state["master"].tensors),
            "engine_stats": list(layout_free_stats(self._es_model().parameters())),
            "predicted_engine_stats": list(predicted),
            "pid": os.getpid(),
        }
