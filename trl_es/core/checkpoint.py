"""ES state inside a Trainer checkpoint, stored without pickle (safetensors and JSON).

The Hugging Face weights in a checkpoint are `cast(master)`. For float32 parameters that is the master itself; for
bf16/fp16 ones it is not, so their float32 master is saved beside them. The starting weights (in their original dtype,
hence exact) are saved too, so that the parameter shift logged after a resume is still measured from the run's start.
Where the master or the `es_optimizer` state is split between processes, each writes its own share to a file of its
own (`save_es_state_shares`), and `es_state.json`, written last, lists every file.

Nothing non-finite is written, and nothing is resumed from without being checked: `checkpoint_problem` says why a
checkpoint cannot be resumed (a file cut off by a crash or a full disk, a missing ES state), `last_complete_checkpoint`
skips such checkpoints with a warning, and `load_es_state` names the file that does not parse.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
import zipfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from .guards import NonFiniteError, check_finite_tensors
from .released_weights import full_shape
from .tensor_files import SafetensorsFile, TensorFiles, TensorStream, drain, shapes_and_dtypes, write_safetensors

ES_STATE_DIR = "es_state"
MASTER_FILE = "master.safetensors"
SCHEDULER_FILE = "scheduler.pt"  # the Trainer's, beside its optimizer state
REFERENCE_FILE = "reference.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"  # the state of `ESConfig.es_optimizer` (empty for plain ES)
META_FILE = "es_state.json"
# 2: `es_state.json` lists the master and optimizer files (each owner of a split master writes its own share);
# format 1 had one of each, `MASTER_FILE` and `OPTIMIZER_FILE` (written before 2026-12-07, still read).
FORMAT_VERSION = 2
READ_FORMAT_VERSIONS = (1, 2)
SHARES = ("master", "optimizer")  # what each process writes of its share: its `<kind>_files` in es_state.json
TRAINER_STATE_FILE = "trainer_state.json"
# The weight files a Trainer checkpoint holds, one of: a single file, a sharded index, a PEFT adapter (safetensors).
MODEL_FILES = ("model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors")


def save_es_state(
    checkpoint_dir: str | os.PathLike,
    master: TensorStream,
    reference: Mapping[str, torch.Tensor],
    metadata: dict,
    optimizer_state: TensorStream | None = None,
) -> None:
    """Write the ES state of a run into `checkpoint_dir/es_state/`, one tensor at a time ([`write_safetensors`]): the
    float32 `master` of the parameters the model's dtype rounds, the `reference` (starting) weights and the
    `es_optimizer` state; the metadata file is written last. A master or optimizer tensor holding NaN or infinity is
    a `NonFiniteError`, raised once both streams are drained (other processes may be sending their tensors) and the
    ES state written so far is removed: the checkpoint has none, and a resume skips it (the reference weights were
    checked when the run started or was resumed)."""
    optimizer_state = optimizer_state or TensorStream.of({})
    state_dir = Path(checkpoint_dir) / ES_STATE_DIR
    state_dir.mkdir(parents=True, exist_ok=True)
    try:
        _write_share(state_dir, MASTER_FILE, master, OPTIMIZER_FILE, optimizer_state, every=True)
        write_reference(state_dir / REFERENCE_FILE, reference)
    except NonFiniteError:
        drain(master)
        drain(optimizer_state)
        shutil.rmtree(state_dir)
        raise
    _write_metadata(state_dir, metadata, [MASTER_FILE], [OPTIMIZER_FILE])


def save_es_state_shares(
    checkpoint_dir: str | os.PathLike,
    rank: int,
    master: TensorStream,
    optimizer_state: TensorStream,
    all_gather: Callable[[object], list],
    reference: Mapping[str, torch.Tensor] | None = None,
    metadata: dict | None = None,
) -> None:
    """Write the ES state into `checkpoint_dir/es_state/` from every process at once (collective): each writes its
    own share of the master and of the `es_optimizer` state (`master`, `optimizer_state`: the tensors it owns), and
    the process that saves (the one given `reference` and `metadata`) also writes the starting weights, then, once
    every share is written, the metadata file listing every share's file. Nothing travels between processes, and
    the writes go on side by side: where one process wrote a whole 70B master (280 GB), eight write 35 GB each. The
    folder must be one that every process writes to (a shared filesystem across nodes, as the Trainer's own
    per-process files need).

    If any process fails (a `NonFiniteError`, a full disk), every process raises once all are done: the failing one
    its own error, the others an error naming it; the process that saves removes the ES state, so the checkpoint has
    none and a resume skips it."""
    saves = metadata is not None
    state_dir = Path(checkpoint_dir) / ES_STATE_DIR
    names = (MASTER_FILE, OPTIMIZER_FILE) if saves else tuple(f"{kind}-rank-{rank}.safetensors" for kind in SHARES)
    written, error = ([], []), None
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        written = _write_share(state_dir, names[0], master, names[1], optimizer_state, every=saves)
        if saves:
            write_reference(state_dir / REFERENCE_FILE, reference)
    except Exception as raised:  # every process hears of it before any goes on
        error = raised
    outcomes = _every_outcome(all_gather, written, error, checkpoint_dir, "write its share of", remove=saves)
    if saves:
        master_files, optimizer_files = ([file for files in outcomes for file in files[kind]] for kind in (0, 1))
        _write_metadata(state_dir, metadata, master_files, optimizer_files)


def save_es_state_copies(
    checkpoint_dir: str | os.PathLike,
    master: TensorStream,
    optimizer_state: TensorStream,
    all_gather: Callable[[object], list],
    reference: Mapping[str, torch.Tensor] | None = None,
    metadata: dict | None = None,
) -> None:
    """Write the whole ES state into `checkpoint_dir/es_state/` ([`save_es_state`]) from every process given
    `metadata` (collective): where several processes save (`save_on_each_node`, each on its machine's disk), each
    tensor travels from the process that owns it to every one of them, so every process reads both streams to their
    end, the others taking their part in sending.

    If any process fails (a `NonFiniteError`, a full disk), every process raises once all are done, as in
    [`save_es_state_shares`], and every process that saves removes its ES state: no machine's checkpoint has one, so
    every machine resumes from the same earlier checkpoint. A process that fails part-way still reads the rest of both
    streams: the others would wait for it in their sends."""
    saves, error = metadata is not None, None
    try:
        if saves:
            save_es_state(checkpoint_dir, master, reference, metadata, optimizer_state)
    except Exception as raised:
        error = raised
    drain(master)
    drain(optimizer_state)
    _every_outcome(all_gather, None, error, checkpoint_dir, "write", remove=saves)


def _every_outcome(all_gather, outcome, error: Exception | None, checkpoint_dir, what: str, remove: bool) -> list:
    """Every process's `outcome` (collective), once each has said whether it failed (`error`). Where any did, the
    checkpoint's ES state is removed (by the processes that `remove` it: those that write its metadata) and every
    process raises: the failing one its own `error`, the others an error naming it, what it could not do and why."""
    outcomes = all_gather((outcome, None if error is None else f"{type(error).__name__}: {error}"))
    failed = [(process, problem) for process, (_, problem) in enumerate(outcomes) if problem is not None]
    if failed and remove:
        shutil.rmtree(Path(checkpoint_dir) / ES_STATE_DIR, ignore_errors=True)
    if error is not None:
        raise error
    if failed:
        process, problem = failed[0]
        kind = NonFiniteError if problem.startswith(f"{NonFiniteError.__name__}:") else RuntimeError
        raise kind(f"Process {process} could not {what} the ES state to {checkpoint_dir}: {problem}")
    return [outcome for outcome, _ in outcomes]


def write_reference(path: Path, reference: Mapping[str, torch.Tensor]) -> None:
    """The run's starting weights at `path`: linked to a file that already holds them where `reference` is kept in
    one ([`SafetensorsFile.write_to`]: every checkpoint of a run shares one file on disk), else written."""
    if isinstance(reference, SafetensorsFile):
        reference.write_to(path)
    else:
        write_safetensors(path, TensorStream.of(reference))


def _write_share(
    state_dir: Path, master_file: str, master: TensorStream, optimizer_file: str, optimizer: TensorStream, every: bool
) -> tuple[list[str], list[str]]:
    """Write `master` and `optimizer` (each tensor checked for non-finite values as it comes) to their files in
    `state_dir`; an empty stream is written only with `every`. Returns the names of the master and optimizer files
    written."""
    written = ([], [])
    for kind, (file, stream, what) in enumerate(
        ((master_file, master, "ES master tensors"), (optimizer_file, optimizer, "es_optimizer state"))
    ):
        if every or stream.layout:
            write_safetensors(state_dir / file, _finite(stream, f"The {what} to be written to {state_dir.parent}"))
            written[kind].append(file)
    return written


def _write_metadata(state_dir: Path, metadata: dict, master_files: list[str], optimizer_files: list[str]) -> None:
    """`es_state.json`, written last: its presence says the ES state is complete."""
    listed = {"master_files": master_files, "optimizer_files": optimizer_files}
    (state_dir / META_FILE).write_text(json.dumps({"format_version": FORMAT_VERSION, **metadata, **listed}, indent=2))


def _finite(stream: TensorStream, what: str) -> TensorStream:
    """`stream`, each tensor checked for non-finite values as it comes (`check_finite_tensors`)."""

    def checked():
        for name, tensor in stream.tensors:
            check_finite_tensors({name: tensor}, what)
            yield name, tensor
            del tensor  # before the next is produced

    return TensorStream(stream.layout, checked())


def load_es_state(checkpoint_dir: str | os.PathLike) -> tuple[TensorFiles, SafetensorsFile, dict]:
    """Read `(float32 masters of non-float32 parameters, reference weights, metadata)` from a checkpoint; a file that
    does not parse is a `ValueError` naming it. Tensors are read one at a time when asked for: a process that keeps a
    share of the master reads only that (the master checks each for non-finite values as it loads it), and the
    reference weights are checked here one tensor at a time."""
    state_dir = Path(checkpoint_dir) / ES_STATE_DIR
    if not (state_dir / META_FILE).is_file():
        raise FileNotFoundError(
            f"{checkpoint_dir} has no ES state ({ES_STATE_DIR}/{META_FILE}), so it was not written by a finished "
            "ESTrainer checkpoint save (or was saved with save_only_model=True, which leaves it out). Resume from an "
            "earlier checkpoint, or pass `resume_from_checkpoint=True` to pick the last complete one."
        )
    problem = _es_state_problem(state_dir)
    if problem is not None:
        raise ValueError(
            f"Cannot resume from {checkpoint_dir}: {problem}. Resume from an earlier checkpoint, or pass "
            "`resume_from_checkpoint=True` to pick the last complete one."
        )
    metadata = json.loads((state_dir / META_FILE).read_text())
    reference = SafetensorsFile(state_dir / REFERENCE_FILE)
    check_finite_tensors(reference, f"The tensors of {state_dir / REFERENCE_FILE}")
    return TensorFiles(_listed_files(state_dir, metadata)[0]), reference, metadata


def load_optimizer_state(checkpoint_dir: str | os.PathLike) -> Mapping[str, torch.Tensor]:
    """The `es_optimizer` state tensors of a checkpoint (none where it was written before the optimizer existed), read
    tensor by tensor when asked for: a process keeps the state of the tensors it owns only."""
    return TensorFiles(es_state_files(checkpoint_dir)[1])


def es_state_files(checkpoint_dir: str | os.PathLike) -> tuple[list[Path], list[Path]]:
    """The master files and the `es_optimizer` state files of a checkpoint's complete ES state: those its
    `es_state.json` lists (one per process that wrote a share), or, in format 1, `MASTER_FILE` and `OPTIMIZER_FILE`
    (absent from checkpoints written before the optimizer existed)."""
    state_dir = Path(checkpoint_dir) / ES_STATE_DIR
    return _listed_files(state_dir, json.loads((state_dir / META_FILE).read_text()))


def _listed_files(state_dir: Path, metadata: dict) -> tuple[list[Path], list[Path]]:
    """`es_state_files`, from the checkpoint's `es_state.json` already read (`metadata`)."""
    if metadata.get("format_version") == 1:
        optimizer = [OPTIMIZER_FILE] if (state_dir / OPTIMIZER_FILE).is_file() else []
        return [state_dir / MASTER_FILE], [state_dir / file for file in optimizer]
    return tuple([state_dir / file for file in metadata[f"{kind}_files"]] for kind in SHARES)


def check_saved_tensors(
    path: str | os.PathLike,
    saved: Mapping[str, torch.Tensor],
    parameters: dict[str, torch.Tensor],
    complete: bool = False,
) -> None:
    """Refuse tensors read from `path` that are not parameters of the model (or, with `complete`, miss one), that do
    not have their parameter's shape (a smaller tensor would be broadcast by `copy_`), or are not floating point
    (from the headers alone where `saved` are [`StoredTensors`])."""
    unknown = sorted(set(saved) - set(parameters))
    missing = sorted(set(parameters) - set(saved)) if complete else []
    if unknown or missing:
        raise ValueError(
            f"{path} does not match the model's evolving parameters: unexpected {unknown[:5]}, missing {missing[:5]}. "
            "Resume with the same model (and PEFT configuration) that wrote the checkpoint."
        )
    for name, (shape, dtype) in shapes_and_dtypes(saved).items():
        expected = tuple(full_shape(parameters[name]))  # a released parameter's too
        if tuple(shape) != expected or not dtype.is_floating_point:
            raise ValueError(
                f"{path} holds {name!r} as a {dtype} tensor of shape {tuple(shape)}, but the model's "
                f"parameter has shape {expected}. Resume with the same model (and PEFT configuration) that wrote the "
                "checkpoint."
            )


def model_weight_files(checkpoint_dir: str | os.PathLike) -> list[Path]:
    """The checkpoint's model files: `model.safetensors`, or the shards its index lists (none if it has neither)."""
    checkpoint_dir = Path(checkpoint_dir)
    if (checkpoint_dir / "model.safetensors").is_file():
        return [checkpoint_dir / "model.safetensors"]
    index = checkpoint_dir / "model.safetensors.index.json"
    if index.is_file():
        return [checkpoint_dir / file for file in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    return []


def float32_model_weights(checkpoint_dir: str | os.PathLike, names: Iterable[str]) -> TensorFiles:
    """The float32 tensors among `names` in the checkpoint's model files, each read when asked for: for a float32 run
    they are the master itself. Names stored in another dtype, or not found, are left out."""
    weights = TensorFiles(model_weight_files(checkpoint_dir))
    return weights.only(name for name in names if weights.dtypes.get(name) == torch.float32)


def checkpoint_problem(path: str | os.PathLike) -> str | None:
    """Why the Trainer checkpoint at `path` cannot be resumed from, or None when every file it needs parses: the
    Trainer state, the model weights, the ES state and the Trainer's optimizer, scheduler and RNG files. Only headers
    and small files are read, never the weights themselves."""
    path = Path(path)
    if not path.is_dir():
        return f"{path} is not a directory"
    problem = _json_problem(path / TRAINER_STATE_FILE, "the save did not finish")
    if problem is None:
        problem = _model_files_problem(path)
    if problem is None:
        state_dir = path / ES_STATE_DIR
        if not (state_dir / META_FILE).is_file():
            return (
                f"it has no {ES_STATE_DIR}/{META_FILE}: the run was saved with save_only_model=True (which writes "
                "only the weights; train with save_only_model=False to resume), or the save did not finish"
            )
        problem = _es_state_problem(state_dir)
    if problem is None and not (path / SCHEDULER_FILE).is_file():
        # Without it the Trainer resumes silently with the learning-rate schedule restarted (issue 27).
        return (
            f"{SCHEDULER_FILE} is missing (the save did not finish): a resume would restart the learning-rate schedule"
        )
    if problem is None:
        for trainer_file in sorted([*path.glob("*.pt"), *path.glob("*.pth")]):
            try:
                zipfile.ZipFile(trainer_file).close()
            except (zipfile.BadZipFile, OSError) as error:
                return f"{trainer_file} does not parse ({error}): the save did not finish"
    return problem


def checkpoints(output_dir: str | os.PathLike) -> list[tuple[Path, str | None]]:
    """Every `checkpoint-<step>` in `output_dir`, newest first, with why it cannot be resumed from (None: it can)."""
    # Imported here: `trl_es.core` imports no transformers, whose import costs seconds in every process that the
    # distributed parts spawn (a trainer has it loaded already).
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    numbered = []
    for path in Path(output_dir).glob(f"{PREFIX_CHECKPOINT_DIR}-*"):
        suffix = path.name[len(PREFIX_CHECKPOINT_DIR) + 1 :]
        if suffix.isdigit() and path.is_dir():
            numbered.append((int(suffix), path))
    return [(path, checkpoint_problem(path)) for _, path in sorted(numbered, reverse=True)]


def is_complete_checkpoint(path: str | os.PathLike) -> bool:
    """Whether the checkpoint at `path` can be resumed from: every file it needs exists and parses (see
    `checkpoint_problem`)."""
    return checkpoint_problem(path) is None


def last_complete_checkpoint(output_dir: str | os.PathLike) -> str | None:
    """The highest-numbered complete `checkpoint-<step>` in `output_dir`. Newer ones that a crash or a full disk left
    half-written are skipped, each with a warning naming it and what is wrong."""
    for path, problem in checkpoints(output_dir):
        if problem is None:
            return str(path)
        warnings.warn(f"Skipping {path}, which cannot be resumed from: {problem}.", UserWarning, stacklevel=2)
    return None


def _json_problem(path: Path, missing: str) -> str | None:
    """Why `path` is not a JSON object (`missing`: why it would be absent), or None."""
    if not path.is_file():
        return f"{path.name} is missing ({missing})"
    try:
        value = json.loads(path.read_text())
    except (ValueError, OSError) as error:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return f"{path} does not parse as JSON ({error}): it was cut off while being written"
    if not isinstance(value, dict):
        return f"{path} holds a {type(value).__name__}, not a JSON object"
    return None


def _safetensors_problem(path: Path) -> str | None:
    """Why `path` is not a complete safetensors file (its header and size are checked, not its values), or None."""
    if not path.is_file():
        return f"{path.name} is missing"
    try:
        with safe_open(path, "pt"):
            pass
    except (SafetensorError, OSError) as error:
        return f"{path} does not parse as safetensors ({error}): it was cut off while being written"
    return None


def _model_files_problem(path: Path) -> str | None:
    present = [name for name in MODEL_FILES if (path / name).is_file()]
    if not present:
        # Weights saved with save_safetensors=False, which the Trainer reads itself; not `training_args.bin`, which
        # every checkpoint holds (issue 27: a checkpoint without its weights counted as complete).
        if any(path.glob("pytorch_model*.bin")) or (path / "adapter_model.bin").is_file():
            return None
        return f"it holds no model weights (none of {', '.join(MODEL_FILES)})"
    for name in present:
        if name.endswith(".json"):
            problem = _json_problem(path / name, "the save did not finish")
            if problem is not None:
                return problem
            shards = json.loads((path / name).read_text()).get("weight_map", {}).values()
            problems = (_safetensors_problem(path / shard) for shard in sorted(set(shards)))
        else:
            problems = (_safetensors_problem(path / name),)
        problem = next((p for p in problems if p is not None), None)
        if problem is not None:
            return problem
    return None


def _is_share_file_name(name: object) -> bool:
    return isinstance(name, str) and name == Path(name).name and name.endswith(".safetensors") and name[0] != "."


def _es_state_problem(state_dir: Path) -> str | None:
    problem = _json_problem(state_dir / META_FILE, "the save did not finish")
    if problem is not None:
        return problem
    metadata = json.loads((state_dir / META_FILE).read_text())
    version = metadata.get("format_version")
    if version not in READ_FORMAT_VERSIONS:
        return (
            f"{state_dir / META_FILE} holds ES state format {version}, but this trl-es reads formats "
            f"{', '.join(map(str, READ_FORMAT_VERSIONS))}; resume it with the trl-es version that wrote it"
        )
    for kind in SHARES if version != 1 else ():
        listed = metadata.get(f"{kind}_files")
        # Plain names of files in es_state/: a server reads them, and must not be led out of its checkpoint folder.
        if not isinstance(listed, list) or not all(map(_is_share_file_name, listed)):
            return f"{state_dir / META_FILE} lists its {kind} files as {listed!r}, not as file names in {state_dir}"
    master_files, optimizer_files = _listed_files(state_dir, metadata)
    for path in (*master_files, state_dir / REFERENCE_FILE, *optimizer_files):
        problem = _safetensors_problem(path)
        if problem is not None:
            return problem
    return None
