"""Checkpoints damaged as a crash or a full disk leaves them, for the resume tests (tests/core/test_checkpoint.py and
tests/trainer/test_resume.py; the finished run they damage copies of is conftest.py's `finished_run`)."""

import json
from pathlib import Path


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _listing(checkpoint: Path, master_files: list[str]) -> None:
    """es_state.json listing `master_files` as the master's shares."""
    path = checkpoint / "es_state" / "es_state.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "master_files": master_files}))


# Every file a resume reads, cut off as a crash or a full disk leaves it; and ES state that parses but is wrong.
DAMAGES = {
    "trainer_state.json": lambda c: _truncate(c / "trainer_state.json"),
    "model.safetensors": lambda c: _truncate(c / "model.safetensors"),
    "es_state.json": lambda c: _truncate(c / "es_state" / "es_state.json"),
    "master.safetensors": lambda c: _truncate(c / "es_state" / "master.safetensors"),
    "reference.safetensors": lambda c: _truncate(c / "es_state" / "reference.safetensors"),
    "scheduler.pt": lambda c: _truncate(c / "scheduler.pt"),
    "holds a list": lambda c: (c / "es_state" / "es_state.json").write_text("[1, 2]"),
    # Files gone, as a crash between two writes leaves them (issue 27): `training_args.bin` is not weights.
    "holds no model weights": lambda c: (c / "model.safetensors").unlink(),
    "scheduler.pt is missing": lambda c: (c / "scheduler.pt").unlink(),
    # A share of the master that another process wrote, gone; a listed name that would lead out of es_state/
    "master-rank-1.safetensors is missing": lambda c: _listing(c, ["master.safetensors", "master-rank-1.safetensors"]),
    "lists its master files as": lambda c: _listing(c, ["../model.safetensors"]),
}
