"""One training run per `output_dir`: a lock file that refuses a second trainer on the same folder.

Two runs writing one folder would overwrite each other's checkpoints, both exiting 0. The lock, `_trl_es.lock` in
`output_dir`, holds its holder's pid, host and start time. It is created atomically (`O_EXCL`) by the main process
only (the process that writes checkpoints to a folder every machine shares), released when training ends (also on an
error), and taken over with a warning from a process of this host that no longer runs, or from an earlier run of the
same SLURM job (a requeued job is restarted only once the earlier run has ended). A lock of another host cannot be
checked, so it is refused with the command that removes it. A process may take a lock it holds again (an
`EvolmTrainer` around its `SequentialTrainer`).

The name starts with `_`, which transformers' Hub pushes leave out (`ignore_patterns=["_*", "checkpoint-*"]`), and
no checkpoint lookup (`checkpoint-*` folders) sees it.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

import psutil
from accelerate import PartialState

from ..core.distributed import from_process

LOCK_FILE = "_trl_es.lock"
# How long a lock file that does not parse yet may be one that its creator is still writing.
_UNREADABLE_WAIT_S = 1.0
# The locks this process holds, with how many times it took each.
_held: dict[Path, int] = {}


class OutputDirInUseError(RuntimeError):
    """Another training run holds the `output_dir` lock (or may hold it: a lock of another host)."""


@dataclass(frozen=True)
class Holder:
    """Who holds a lock: the process (pid, host, its start time), when it took the lock, and its SLURM job."""

    pid: int
    host: str
    process_started: float
    locked_at: str
    slurm_job: str | None = None
    slurm_restart: int = 0

    @classmethod
    def this_process(cls) -> Holder:
        return cls(
            pid=os.getpid(),
            host=socket.gethostname(),
            process_started=psutil.Process().create_time(),
            locked_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            slurm_job=os.environ.get("SLURM_JOB_ID"),
            slurm_restart=int(os.environ.get("SLURM_RESTART_COUNT") or 0),
        )

    def describe(self) -> str:
        return f"pid {self.pid} on host {self.host}, since {self.locked_at}" + (
            f" (SLURM job {self.slurm_job})" if self.slurm_job else ""
        )

    def has_ended(self, me: Holder) -> bool | None:
        """Whether the holding process has ended: None when this host cannot tell (another host)."""
        if self.slurm_job and self.slurm_job == me.slurm_job and self.slurm_restart < me.slurm_restart:
            return True  # an earlier run of this requeued job
        if self.host != me.host:
            return None
        try:
            process = psutil.Process(self.pid)
            if process.status() == psutil.STATUS_ZOMBIE:
                return True
            return abs(process.create_time() - self.process_started) > 1.0  # the pid now names another process
        except psutil.NoSuchProcess:
            return True
        except psutil.AccessDenied:  # another user's process, running
            return False


@contextmanager
def hold_output_dir(output_dir: str | os.PathLike, state=None) -> Iterator[None]:
    """Hold `output_dir`'s lock for the block: the main process of `state` (an `Accelerator` or a `PartialState`,
    by default the current one) takes it, every process raises if it could not (`OutputDirInUseError`, naming the
    holder and what to do), and the main process releases it on the way out."""
    state = state or PartialState()
    path = Path(output_dir) / LOCK_FILE
    main = state.is_main_process  # read now: a SequentialTrainer resets the Accelerate state between its stages
    failure = None
    if main:
        try:
            acquire(path)
        except Exception as error:  # every process must learn of it, or the others would wait for it forever
            failure = error
    refusal = from_process(state, None if failure is None else str(failure), 0)
    if failure is not None:
        raise failure
    if refusal is not None:
        raise OutputDirInUseError(f"The main process could not lock {output_dir}: {refusal}")
    try:
        yield
    finally:
        if main:
            release(path)


def acquire(path: Path) -> None:
    """Create the lock file `path` for this process, taking over a lock whose holder has ended (with a warning)."""
    key = path.resolve()
    if key in _held:
        _held[key] += 1
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    me = Holder.this_process()
    for _ in range(3):  # a takeover that lost a race looks again
        try:
            descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                holder = read_holder(path)
            except FileNotFoundError:  # released meanwhile
                continue
            ended = holder.has_ended(me)
            if ended is None:
                raise OutputDirInUseError(
                    f"output_dir {path.parent} is locked by {holder.describe()} (lock file {path}). This host "
                    f"({me.host}) cannot check whether that process still runs; two runs in one output_dir overwrite "
                    "each other's checkpoints. Wait for that run to end or give this run another output_dir; if you "
                    f"know that run has stopped, remove the lock: rm {shlex.quote(str(path))}"
                ) from None
            if not ended:
                raise OutputDirInUseError(
                    f"output_dir {path.parent} is in use by another training run: {holder.describe()} (lock file "
                    f"{path}). Two runs in one output_dir overwrite each other's checkpoints. Wait for that run to "
                    "end or stop it, or give this run another output_dir."
                ) from None
            if _take_over(path, holder, me):
                warnings.warn(
                    f"Taking over the lock of output_dir {path.parent} from {holder.describe()}: that process no "
                    "longer runs (it was killed or crashed). Its checkpoints are kept; resume_from_checkpoint=True "
                    "continues from the last complete one.",
                    UserWarning,
                    stacklevel=2,
                )
            continue
        with os.fdopen(descriptor, "w") as file:
            json.dump(asdict(me), file)
            file.flush()
            os.fsync(file.fileno())
        _held[key] = 1
        return
    raise OutputDirInUseError(f"Could not lock output_dir {path.parent}: other runs keep taking its lock {path}.")


def release(path: Path) -> None:
    """Give up one hold of the lock; the last one removes the file, if it is still this process's."""
    key = path.resolve()
    _held[key] -= 1
    if _held[key]:
        return
    del _held[key]
    try:
        holder = read_holder(path)
    except (FileNotFoundError, OutputDirInUseError):
        holder = None
    if holder is None or (holder.pid, holder.host) != (os.getpid(), socket.gethostname()):
        warnings.warn(f"The lock {path} was removed or replaced while this run held it: left as it is.", stacklevel=3)
        return
    path.unlink(missing_ok=True)


def read_holder(path: Path) -> Holder:
    """The holder a lock file names. A file that does not parse is given a moment (its creator may be writing it),
    then refused with the command that removes it."""
    deadline = time.monotonic() + _UNREADABLE_WAIT_S
    while True:
        try:
            return Holder(**json.loads(path.read_text()))
        except (ValueError, TypeError) as error:
            if time.monotonic() > deadline:
                raise OutputDirInUseError(
                    f"output_dir {path.parent} has a lock file that does not name its holder ({error}): another run "
                    f"may hold it. If no run uses this output_dir, remove it: rm {shlex.quote(str(path))}"
                ) from None
            time.sleep(0.05)


def _take_over(path: Path, holder: Holder, me: Holder) -> bool:
    """Move the ended holder's lock aside, atomically: of several runs taking it over at once, one moves it. False
    when another run took it first (then what was moved, that run's lock, is put back)."""
    aside = path.with_name(f"{path.name}.ended-{me.host}-{me.pid}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return False
    try:
        moved = read_holder(aside)
    except OutputDirInUseError:
        moved = None
    if moved is not None and moved != holder:
        os.replace(aside, path)
        return False
    aside.unlink()
    return True
