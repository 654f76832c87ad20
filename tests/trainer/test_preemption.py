"""Preemption (`trl_es.trainer.preemption`): SIGTERM or SIGUSR1 received during a step ends training after that step,
with a complete checkpoint and `TrainingPreempted` (exit status 128 + signal); the script's own handlers are back
afterwards. The signals are raised in this process by a reward function, in the middle of a step; a handler of the
test's own stands where a script's would, so a signal that escaped ours would be recorded, not end pytest.
Subprocesses, two ranks and the resume to the uninterrupted weights: tests/integration/test_faults.py."""

import logging
import signal
import threading

import pytest
from scripts.fast_es import MOVING, fast_es_config

from trl_es import ESTrainer
from trl_es.core.checkpoint import checkpoint_problem
from trl_es.testing import digit_fraction, digit_prompts
from trl_es.trainer.preemption import PREEMPTION_SIGNALS, TrainingPreempted

# One reward call per member, 4 members per step: call 6 is the second member of step 2.
MEMBERS_PER_STEP = 4


def reward_raising(signal_number, at_call, error=None):
    """digit_fraction, that raises `signal_number` in this process at its `at_call`-th call (or `error`)."""
    calls = 0

    def digit_reward(completions, **kwargs):
        nonlocal calls
        calls += 1
        if calls == at_call:
            if error is not None:
                raise error
            signal.raise_signal(signal_number)
        return digit_fraction(completions)

    return digit_reward


@pytest.fixture
def script_handlers():
    """The handlers a script had installed before training: they record every signal that reaches them."""
    reached = []

    def handler(signal_number, frame):
        reached.append(signal_number)

    previous = {number: signal.signal(number, handler) for number in PREEMPTION_SIGNALS}
    yield handler, reached
    for number, earlier in previous.items():
        signal.signal(number, earlier)


def trainer_for(tiny_model_path, output_dir, reward, **overrides):
    args = fast_es_config(output_dir, **{"max_steps": 4, **MOVING, **overrides})
    return ESTrainer(model=tiny_model_path, reward_funcs=reward, args=args, train_dataset=digit_prompts(8))


@pytest.mark.parametrize(("name", "status"), [("SIGTERM", 143), ("SIGUSR1", 138)])
def test_a_signal_during_a_step_stops_training_after_it_with_a_complete_checkpoint(
    tiny_model_path, tmp_path, script_handlers, name, status
):
    number = getattr(signal, name)
    # save_strategy="no": the preemption checkpoint is written all the same.
    trainer = trainer_for(tiny_model_path, tmp_path, reward_raising(number, MEMBERS_PER_STEP + 2))
    with pytest.raises(TrainingPreempted) as stopped:
        trainer.train()

    error = stopped.value
    assert isinstance(error, SystemExit) and error.code == status and error.signal_number == number
    assert error.step == trainer.state.global_step == 2
    assert error.checkpoint == str(tmp_path / "checkpoint-2")
    assert checkpoint_problem(error.checkpoint) is None
    assert sorted(path.name for path in tmp_path.glob("checkpoint-*")) == ["checkpoint-2"]
    assert f"Received {name} during step 2" in str(error) and "resume_from_checkpoint=True" in str(error)
    assert f"status {status}" in str(error)
    handler, reached = script_handlers
    assert reached == []  # ours took the signal
    assert all(signal.getsignal(number) is handler for number in PREEMPTION_SIGNALS)


def test_a_signal_during_the_last_step_lets_training_finish(tiny_model_path, tmp_path, script_handlers, caplog):
    trainer = trainer_for(tiny_model_path, tmp_path, reward_raising(signal.SIGTERM, 3 * MEMBERS_PER_STEP + 1))
    with caplog.at_level(logging.WARNING, logger="trl_es.trainer.preemption"):
        trainer.train()
    assert trainer.state.global_step == 4
    assert "Received SIGTERM after the last step had started" in caplog.text
    handler, _ = script_handlers
    assert signal.getsignal(signal.SIGTERM) is handler


def test_the_previous_handlers_are_restored_after_a_training_error(tiny_model_path, tmp_path, script_handlers):
    trainer = trainer_for(tiny_model_path, tmp_path, reward_raising(None, 2, error=KeyError("a broken reward")))
    with pytest.raises(KeyError, match="a broken reward"):
        trainer.train()
    handler, _ = script_handlers
    assert all(signal.getsignal(number) is handler for number in PREEMPTION_SIGNALS)


def test_training_outside_the_main_thread_warns_and_installs_no_handler(tiny_model_path, tmp_path, script_handlers):
    handlers_during_training, failures = [], []

    def watching_reward(completions, **kwargs):
        handlers_during_training.append(signal.getsignal(signal.SIGTERM))
        return digit_fraction(completions)

    trainer = trainer_for(tiny_model_path, tmp_path, watching_reward, max_steps=1)

    def train():
        try:
            trainer.train()
        except BaseException as error:  # reported to the main thread
            failures.append(error)

    with pytest.warns(UserWarning, match="outside the main thread, where Python cannot install signal handlers"):
        thread = threading.Thread(target=train)
        thread.start()
        thread.join()
    assert not failures and trainer.state.global_step == 1
    handler, _ = script_handlers
    assert handlers_during_training and all(found is handler for found in handlers_during_training)
