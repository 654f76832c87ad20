"""Train ES on the tiny model in a subprocess; optionally SIGKILL the process in the middle of a step.

Used by tests/test_faults.py: python train_until_killed.py MODEL OUTPUT_DIR [--kill-at-reward-call N] [--resume]
"""

import argparse
import os
import signal

from datasets import Dataset

from trl_es import ESConfig, ESTrainer


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
        return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]

    args = ESConfig(
        output_dir=cli.output_dir,
        population_size=4,
        per_device_train_batch_size=4,
        max_completion_length=6,
        temperature=1.0,
        sigma=0.05,
        learning_rate=0.01,
        max_steps=6,
        save_strategy="steps",
        save_steps=2,
        logging_steps=1,
        report_to=[],
        disable_tqdm=True,
        use_cpu=True,
    )
    dataset = Dataset.from_dict({"prompt": [f"Item {k}:" for k in range(8)]})
    trainer = ESTrainer(model=cli.model, reward_funcs=digit_reward, args=args, train_dataset=dataset)
    trainer.train(resume_from_checkpoint=True if cli.resume else None)
    trainer.save_model(os.path.join(cli.output_dir, "final"))


if __name__ == "__main__":
    main()
