"""Checkpoints damaged as a crash or a full disk leaves them, for the resume tests (tests/core/test_checkpoint.py and
tests/trainer/test_resume.py; the finished run they damage copies of is conftest.py's `finished_run`)."""

from pathlib import Path


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


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
}
