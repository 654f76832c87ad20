"""Train ES on the tiny model in a subprocess; optionally SIGKILL the process in the middle of a step.

Used by tests/integration/test_faults.py:
    python train_until_killed.py MODEL OUTPUT_DIR [--kill-at-reward-call N] [--resume]
"""

import argparse
import os
import signal

from fast_es import MOVING, fast_es_config

from trl_es import ESTrainer
from trl_es.testing import digit_fraction, digit_prompts


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("output_dir")
    parser.add_argument("--kill-at-reward-call", type=int, default=None)
    parser.add_argument("--resume", action="store_true")
    cli = parser.parse_args()

    calls = 0

    def digit_reward(completions, **kwargs):
        nonlocal calls
        calls += 1
        if calls == cli.kill_at_reward_call:
            os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no exception handlers: as a crash or an OOM kill
        return digit_fraction(completions)

    args = fast_es_config(cli.output_dir, max_steps=6, save_strategy="steps", save_steps=2, **MOVING)
    trainer = ESTrainer(model=cli.model, reward_funcs=digit_reward, args=args, train_dataset=digit_prompts(8))
    trainer.train(resume_from_checkpoint=True if cli.resume else None)
    trainer.save_model(os.path.join(cli.output_dir, "final"))


if __name__ == "__main__":
    main()
