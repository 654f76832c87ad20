"""Train ES on the tiny model in a subprocess; optionally kill it (SIGKILL) or preempt it (SIGTERM, SIGUSR1) in the
middle of a step.

Used by tests/integration/test_faults.py and tests/trainer/test_output_lock.py:
    python train_until_killed.py MODEL OUTPUT_DIR [--kill-at-reward-call N] [--save-steps S] [--resume]
    python train_until_killed.py MODEL OUTPUT_DIR --signal TERM --signal-at-reward-call N [--signal-rank R]
        [--signal-the-launcher]
and the same with `accelerate launch` (tests/scripts/launch.py): every run sees 4 prompts per step, so runs on any
number of processes end with the same weights. The signal is raised at the N-th reward call of rank R (a process
calls the reward function once per member it evaluates); with --signal-the-launcher, rank R sends it to its parent,
the `accelerate launch` process, which forwards it to every rank. A preempted process writes `stopped_rank<R>` (the
step it stopped after) and exits with `TrainingPreempted`'s status.
"""

import argparse
import os
import signal
from pathlib import Path

from fast_es import MOVING, fast_es_config

from trl_es import ESTrainer
from trl_es.testing import digit_fraction, digit_prompts
from trl_es.trainer.preemption import TrainingPreempted

PROMPTS_PER_STEP = 4


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("output_dir")
    parser.add_argument("--kill-at-reward-call", type=int, default=None)
    parser.add_argument("--signal", choices=["TERM", "USR1"], default=None)
    parser.add_argument("--signal-at-reward-call", type=int, default=None)
    parser.add_argument("--signal-rank", type=int, default=0)
    parser.add_argument("--signal-the-launcher", action="store_true")
    parser.add_argument("--save-steps", type=int, default=2)
    parser.add_argument("--resume", action="store_true")
    cli = parser.parse_args()

    rank = int(os.environ.get("RANK", 0))
    processes = int(os.environ.get("WORLD_SIZE", 1))  # read before the config creates the distributed state
    calls = 0

    def digit_reward(completions, **kwargs):
        nonlocal calls
        calls += 1
        if calls == cli.kill_at_reward_call:
            os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no exception handlers: as a crash or an OOM kill
        if cli.signal and calls == cli.signal_at_reward_call and rank == cli.signal_rank:
            os.kill(os.getppid() if cli.signal_the_launcher else os.getpid(), getattr(signal, f"SIG{cli.signal}"))
        return digit_fraction(completions)

    args = fast_es_config(
        cli.output_dir,
        per_device_train_batch_size=PROMPTS_PER_STEP // processes,
        max_steps=6,
        save_strategy="steps",
        save_steps=cli.save_steps,
        **MOVING,
    )
    trainer = ESTrainer(model=cli.model, reward_funcs=digit_reward, args=args, train_dataset=digit_prompts(8))
    try:
        trainer.train(resume_from_checkpoint=True if cli.resume else None)
    except TrainingPreempted as stopped:
        Path(cli.output_dir, f"stopped_rank{rank}").write_text(str(stopped.step))
        raise
    trainer.save_model(os.path.join(cli.output_dir, "final"))
    if processes > 1:  # leave together: a rank that exits while gloo threads still run aborts
        trainer.accelerator.wait_for_everyone()
        trainer.accelerator.end_training()


if __name__ == "__main__":
    main()
