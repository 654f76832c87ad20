"""The output_dir lock (`trl_es.trainer.output_lock`): a second run on a folder that a live run holds is refused,
naming the holder; a lock whose process ended is taken over with a warning; a lock of another host is refused with
the command that removes it; the lock is gone after training, also after an error, and is never pushed."""

import inspect
import json
import os
import socket
import subprocess
import sys
import textwrap
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path

import pytest
from accelerate import PartialState
from huggingface_hub.utils import filter_repo_objects
from scripts.fast_es import fast_es_config
from scripts.launch import launch
from scripts.paths import SCRIPTS
from transformers import Trainer
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from trl_es import ESTrainer, SequentialTrainer
from trl_es.core.checkpoint import checkpoints
from trl_es.testing import digit_fraction, digit_prompts
from trl_es.trainer.output_lock import LOCK_FILE, Holder, OutputDirInUseError, acquire, hold_output_dir, release

HOLD = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from trl_es.trainer.output_lock import LOCK_FILE, acquire, release
    lock = Path(sys.argv[1]) / LOCK_FILE
    acquire(lock)
    print("HELD", flush=True)
    sys.stdin.read()
    release(lock)
    """
)


@contextmanager
def held_by_another_process(output_dir):
    """A live process of this host that holds `output_dir`'s lock until the block ends."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(output_dir)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "HELD"
        yield holder
    finally:
        holder.communicate(timeout=60)  # closes its stdin: it releases the lock and exits


def write_lock(output_dir, **fields):
    """A lock file as a run with these holder fields (this process's otherwise) left it."""
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    holder = replace(Holder.this_process(), **fields)
    (Path(output_dir) / LOCK_FILE).write_text(json.dumps(asdict(holder)))
    return holder


def ended_pid() -> int:
    """The pid of a process of this host that has ended."""
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def es_trainer(tiny_model_path, output_dir, reward=digit_fraction, **overrides):
    args = fast_es_config(output_dir, **{"max_steps": 1, **overrides})
    return ESTrainer(model=tiny_model_path, reward_funcs=reward, args=args, train_dataset=digit_prompts(8))


def test_a_second_trainer_on_a_held_output_dir_is_refused_naming_the_holder(tiny_model_path, tmp_path):
    trainer = es_trainer(tiny_model_path, tmp_path)
    with held_by_another_process(tmp_path) as holder:
        with pytest.raises(OutputDirInUseError, match="is in use by another training run") as refused:
            trainer.train()
        lock = json.loads((tmp_path / LOCK_FILE).read_text())
    assert f"pid {holder.pid} on host {socket.gethostname()}" in str(refused.value)
    assert "give this run another output_dir" in str(refused.value)
    assert lock["pid"] == holder.pid  # the holder's lock was left alone
    assert trainer.state.global_step == 0 and not list(tmp_path.glob("checkpoint-*"))


def test_a_second_sequential_run_on_the_same_output_dir_is_refused(tiny_model_path, tmp_path):
    sequence = SequentialTrainer(
        tiny_model_path,
        [fast_es_config(tmp_path)],
        output_dir=str(tmp_path),
        reward_funcs=digit_fraction,
        train_dataset=digit_prompts(8),
    )
    with held_by_another_process(tmp_path) as holder, pytest.raises(OutputDirInUseError, match=f"pid {holder.pid}"):
        sequence.train()
    assert not sequence.stage_dir(0).exists()


def test_a_lock_left_by_a_process_that_ended_is_taken_over_with_a_warning(tiny_model_path, tmp_path):
    dead = write_lock(tmp_path, pid=ended_pid())
    trainer = es_trainer(tiny_model_path, tmp_path)
    with pytest.warns(UserWarning, match=f"from pid {dead.pid} on host .*: that process no longer runs"):
        trainer.train()
    assert trainer.state.global_step == 1
    assert not (tmp_path / LOCK_FILE).exists()


def test_a_lock_whose_pid_now_names_another_process_is_taken_over(tmp_path):
    write_lock(tmp_path, process_started=Holder.this_process().process_started - 1000)  # this pid, an older process
    with pytest.warns(UserWarning, match="no longer runs"):
        acquire(tmp_path / LOCK_FILE)
    assert json.loads((tmp_path / LOCK_FILE).read_text())["process_started"] == Holder.this_process().process_started
    release(tmp_path / LOCK_FILE)


def test_a_lock_of_another_host_is_refused_with_the_command_that_removes_it(tmp_path):
    write_lock(tmp_path, host="node-17", pid=4321)
    with pytest.raises(OutputDirInUseError) as refused:
        acquire(tmp_path / LOCK_FILE)
    message = str(refused.value)
    assert "locked by pid 4321 on host node-17" in message
    assert "cannot check whether that process still runs" in message
    assert message.endswith(f"remove the lock: rm {tmp_path / LOCK_FILE}")
    assert json.loads((tmp_path / LOCK_FILE).read_text())["host"] == "node-17"


def test_a_requeued_slurm_job_takes_over_the_lock_of_its_earlier_run(tmp_path, monkeypatch):
    write_lock(tmp_path, host="node-17", slurm_job="4242", slurm_restart=0)
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    with pytest.warns(UserWarning, match=r"on host node-17, since .* \(SLURM job 4242\): that process no longer runs"):
        acquire(tmp_path / LOCK_FILE)
    release(tmp_path / LOCK_FILE)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")  # the same run of the job on another node: not its own to take
    write_lock(tmp_path, host="node-17", slurm_job="4242", slurm_restart=0)
    with pytest.raises(OutputDirInUseError, match="cannot check"):
        acquire(tmp_path / LOCK_FILE)


def test_a_lock_file_that_names_no_holder_is_refused_with_the_command_that_removes_it(tmp_path):
    (tmp_path / LOCK_FILE).write_text("")
    with pytest.raises(OutputDirInUseError, match=f"does not name its holder .* rm {tmp_path / LOCK_FILE}"):
        acquire(tmp_path / LOCK_FILE)


def test_the_lock_is_held_while_training_and_gone_after_it_and_after_an_error(tiny_model_path, tmp_path):
    holders = []

    def watching_reward(completions, **kwargs):
        holders.append(json.loads((tmp_path / "run" / LOCK_FILE).read_text())["pid"])
        return digit_fraction(completions)

    es_trainer(tiny_model_path, tmp_path / "run", watching_reward).train()
    assert holders and set(holders) == {os.getpid()}
    assert not (tmp_path / "run" / LOCK_FILE).exists()

    def broken_reward(completions, **kwargs):
        raise KeyError("a broken reward")

    with pytest.raises(KeyError, match="a broken reward"):
        es_trainer(tiny_model_path, tmp_path / "run", broken_reward).train()
    assert not (tmp_path / "run" / LOCK_FILE).exists()


def test_a_process_may_take_a_lock_it_holds_again(tmp_path):
    with hold_output_dir(tmp_path, PartialState()):
        with hold_output_dir(tmp_path, PartialState()):  # an EvolmTrainer around its SequentialTrainer
            pass
        assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    assert not (tmp_path / LOCK_FILE).exists()


def test_the_lock_file_is_no_checkpoint_and_hub_pushes_leave_it_out(tmp_path):
    # transformers' pushes of output_dir (push_to_hub and every checkpoint push) leave out these patterns.
    patterns = ["_*", f"{PREFIX_CHECKPOINT_DIR}-*"]
    for method in (Trainer.push_to_hub, Trainer._push_from_checkpoint):
        assert 'ignore_patterns=["_*", f"{PREFIX_CHECKPOINT_DIR}-*"]' in inspect.getsource(method)
    files = [LOCK_FILE, "model.safetensors", "README.md"]
    assert list(filter_repo_objects(files, ignore_patterns=patterns)) == ["model.safetensors", "README.md"]
    write_lock(tmp_path)
    assert checkpoints(tmp_path) == []


@pytest.mark.slow
def test_every_process_of_a_run_is_refused_when_its_main_process_cannot_lock(tmp_path, tiny_model_path):
    with held_by_another_process(tmp_path) as holder:
        run = launch(2, tiny_model_path, tmp_path, script=SCRIPTS / "train_until_killed.py")
    assert run.returncode != 0
    assert run.stderr.count(f"pid {holder.pid} on host") >= 2, run.stderr[-3000:]  # rank 0's refusal, and rank 1's
    assert "The main process could not lock" in run.stderr
    assert not list(tmp_path.glob("checkpoint-*"))
