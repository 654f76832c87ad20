"""Preemption: a scheduler's SIGTERM (or SLURM's early SIGUSR1) ends training after the current step, with a
checkpoint to resume from.

The signal handler only records the signal. At the end of every step the processes agree on what any of them
received (one integer each, gathered), so every process stops after the same step even when the signal reached one
rank, or reached them at different moments. The Trainer then saves that step's checkpoint, the ordinary kind that
`resume_from_checkpoint=True` resumes from, and `train` raises `TrainingPreempted`: a `SystemExit` whose status is
128 + the signal number (143 for SIGTERM, 138 for SIGUSR1), what a shell reports for a process that signal ended.
"""

from __future__ import annotations

import logging
import signal
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..core.distributed import every_process_value

logger = logging.getLogger(__name__)

# SIGUSR1 is what SLURM sends ahead of the time limit with `--signal=USR1@<seconds>`; Windows has no SIGUSR1.
PREEMPTION_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGUSR1") if hasattr(signal, name))


class TrainingPreempted(SystemExit):
    """Training stopped on a preemption signal, after the step it was received in, with that step's checkpoint saved.

    Left uncaught it ends the script, without a traceback, with exit status `128 + signal_number` (143 for SIGTERM,
    138 for SIGUSR1); the message (`str(error)`) has been logged by the main process. Catch it to act before exiting
    (e.g. requeue the job).

    Attributes:
        signal_number (`int`): The signal received (SIGTERM's when processes received different ones).
        step (`int`): The last step trained, the step of `checkpoint`.
        checkpoint (`str`): The checkpoint saved after that step.
    """

    def __init__(self, signal_number: int, step: int, checkpoint: str, message: str):
        super().__init__(128 + signal_number)
        self.signal_number = signal_number
        self.step = step
        self.checkpoint = checkpoint
        self.message = message

    def __str__(self) -> str:
        return self.message


class PreemptionCallback(TrainerCallback):
    """Stops training after the step in which any process received a preemption signal: at every step end the
    processes agree (`every_process_value`); after a signal the step is logged and checkpointed (not evaluated: the
    scheduler's grace period is short), and once the checkpoint is written `TrainingPreempted` is raised. A signal
    received during the last step lets training end as usual."""

    def __init__(self, accelerator):
        self.accelerator = accelerator
        self.received = 0  # this process's signal, set by the handler
        self.signals: list[int] = []  # every process's, once they agreed to stop

    def handle(self, signal_number: int, frame) -> None:
        # No I/O in a signal handler: it interrupts the main thread anywhere, e.g. inside a write to stderr.
        self.received = max(self.received, signal_number)

    def on_step_end(self, args, state, control, **kwargs):
        signals = every_process_value(self.accelerator, self.received)
        if any(signals) and state.global_step < state.max_steps:
            self.signals = signals
            control.should_save = control.should_log = control.should_training_stop = True
            control.should_evaluate = False
        return control

    def on_save(self, args, state, control, **kwargs):
        if self.signals:
            step = state.global_step
            checkpoint = str(Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{step}")
            error = TrainingPreempted(max(self.signals), step, checkpoint, self._message(step, checkpoint))
            if self.accelerator.is_main_process:
                logger.warning(error.message)
            raise error
        return control

    def _message(self, step: int, checkpoint: str) -> str:
        names = sorted({signal.Signals(number).name for number in self.signals if number})
        processes = len(self.signals)
        receivers = [rank for rank, number in enumerate(self.signals) if number]
        where = ""
        if processes > 1 and len(receivers) == processes:
            where = " on every process"
        elif processes > 1:
            where = f" on process{'es' if len(receivers) > 1 else ''} {', '.join(map(str, receivers))} of {processes}"
        code = 128 + max(self.signals)
        return (
            f"Received {' and '.join(names)}{where} during step {step}: training stopped after that step "
            f"and saved the checkpoint {checkpoint}. To resume, run the script again with the same output_dir and "
            f"`train(resume_from_checkpoint=True)` (or resume_from_checkpoint={checkpoint!r}); a SequentialTrainer "
            f"or EvolmTrainer resumes when its `train()` runs again. Exiting with status {code} (128 + signal)."
        )


@contextmanager
def stop_on_preemption(trainer) -> Iterator[PreemptionCallback]:
    """Within the block, SIGTERM and SIGUSR1 make `trainer` stop after the current step with a checkpoint and raise
    `TrainingPreempted` (see the module docstring); the previous handlers are restored on the way out.

    Python installs signal handlers from the main thread only: elsewhere this warns and installs none (the processes
    still agree at every step, so the ranks stop together when one of them runs in its main thread)."""
    callback = PreemptionCallback(trainer.accelerator)
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {number: signal.signal(number, callback.handle) for number in PREEMPTION_SIGNALS}
    else:
        names = " and ".join(signal.Signals(number).name for number in PREEMPTION_SIGNALS)
        warnings.warn(
            f"train() runs outside the main thread, where Python cannot install signal handlers: {names} will not "
            "stop this run with a checkpoint (the handlers in place act on them; by default they end the process). "
            "Call train() from the main thread to stop cleanly on a cluster's preemption signals.",
            UserWarning,
            stacklevel=4,
        )
    trainer.add_callback(callback)
    try:
        yield callback
    except TrainingPreempted:
        # No process leaves before the checkpoint is whole: a launcher stops every rank once the first one exits.
        trainer.accelerator.wait_for_everyone()
        raise
    finally:
        trainer.remove_callback(callback)
        for number, handler in previous.items():
            signal.signal(number, signal.SIG_DFL if handler is None else handler)  # None: set outside Python
    if callback.received:
        logger.warning(
            f"Received {signal.Signals(callback.received).name} after the last step had started: training finished "
            "as usual and the signal was not acted upon."
        )
