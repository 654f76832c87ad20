"""ES state inside a Trainer checkpoint, stored without pickle (safetensors and JSON).

The Hugging Face weights in a checkpoint are `cast(master)`. For float32 parameters that is the master itself; for
bf16/fp16 ones it is not, so their float32 master is saved beside them. The starting weights (in their original dtype,
hence exact) are saved too, so that the parameter shift logged after a resume is still measured from the run's start.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

ES_STATE_DIR = "es_state"
MASTER_FILE = "master.safetensors"
REFERENCE_FILE = "reference.safetensors"
META_FILE = "es_state.json"
FORMAT_VERSION = 1


def _contiguous_cpu(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().to("cpu").contiguous() for name, tensor in tensors.items()}


def save_es_state(
    checkpoint_dir: str | os.PathLike,
    master: dict[str, torch.Tensor],
    parameter_dtypes: dict[str, torch.dtype],
    reference: dict[str, torch.Tensor],
    metadata: dict,
) -> None:
    """Write the ES state of a run into `checkpoint_dir/es_state/`; the metadata file is written last."""
    state_dir = Path(checkpoint_dir) / ES_STATE_DIR
    state_dir.mkdir(parents=True, exist_ok=True)
    lossy = {name: tensor for name, tensor in master.items() if parameter_dtypes[name] != torch.float32}
    save_file(_contiguous_cpu(lossy), state_dir / MASTER_FILE)
    save_file(_contiguous_cpu(reference), state_dir / REFERENCE_FILE)
    (state_dir / META_FILE).write_text(json.dumps({"format_version": FORMAT_VERSION, **metadata}, indent=2))


def load_es_state(checkpoint_dir: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict]:
    """Read `(float32 masters of non-float32 parameters, reference weights, metadata)` from a checkpoint."""
    state_dir = Path(checkpoint_dir) / ES_STATE_DIR
    if not (state_dir / META_FILE).is_file():
        raise FileNotFoundError(
            f"{checkpoint_dir} has no ES state ({ES_STATE_DIR}/{META_FILE}), so it was not written by a finished "
            "ESTrainer checkpoint save. Resume from an earlier checkpoint, or pass `resume_from_checkpoint=True` to "
            "pick the last complete one."
        )
    metadata = json.loads((state_dir / META_FILE).read_text())
    if metadata.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"{checkpoint_dir} holds ES state format {metadata.get('format_version')}, but this trl-es reads format "
            f"{FORMAT_VERSION}. Resume it with the trl-es version that wrote it."
        )
    return load_file(state_dir / MASTER_FILE), load_file(state_dir / REFERENCE_FILE), metadata


def is_complete_checkpoint(path: str | os.PathLike) -> bool:
    """A checkpoint is complete once the Trainer state (written after the ES state) exists."""
    path = Path(path)
    return (path / "trainer_state.json").is_file() and (path / ES_STATE_DIR / META_FILE).is_file()


def last_complete_checkpoint(output_dir: str | os.PathLike) -> str | None:
    """The highest-numbered complete `checkpoint-<step>` in `output_dir`, skipping any a crash left half-written."""
    candidates = []
    for path in Path(output_dir).glob(f"{PREFIX_CHECKPOINT_DIR}-*"):
        suffix = path.name[len(PREFIX_CHECKPOINT_DIR) + 1 :]
        if suffix.isdigit() and is_complete_checkpoint(path):
            candidates.append((int(suffix), path))
    return str(max(candidates)[1]) if candidates else None
