"""An EVOLM run (ES policy and rubric phases) on the tiny model; optionally SIGKILLed in the middle of a phase.

Used by tests/integration/test_faults.py:
    python evolm_until_killed.py MODEL OUTPUT_DIR [--kill-in-phase I --kill-at-step S]
Running the same command again resumes.
"""

import argparse
import os
import signal
from pathlib import Path

from datasets import Dataset
from fast_es import MOVING, fast_es_config
from transformers import TrainerCallback

from trl_es.evolm import EvolmConfig, EvolmTrainer, rewards
from trl_es.evolm.rubrics import Criterion, Rubric

# The tiny random model writes no JSON, so every rubric would be invalid, every reward constant and the weights would
# never move: this script reads any text as a one-criterion rubric, so that the rewards vary and a resumed run that
# went wrong would end with other weights.
rewards.parse_rubric = lambda text, rules=None: Rubric((Criterion(text or "-", 1.0),))
rewards.rubric_is_valid = lambda text, rules=None: True


class TextJudge:
    """Deterministic, and depends on the rubric and the response, so that both roles' rewards vary."""

    async def score(self, question, rubric, response):
        return (len(response) % (len(rubric) % 5 + 2)) / 6


class KillAt(TrainerCallback):
    def __init__(self, phase: int | None, step: int | None):
        self.phase, self.step = phase, step

    def on_step_end(self, args, state, control, **kwargs):
        if Path(args.output_dir).name.startswith(f"stage-{self.phase}-") and state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no exception handlers: as a crash or an OOM kill


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("output_dir")
    parser.add_argument("--kill-in-phase", type=int, default=None)
    parser.add_argument("--kill-at-step", type=int, default=None)
    cli = parser.parse_args()

    phase = dict(max_steps=4, save_strategy="steps", save_steps=2, **MOVING)
    args = EvolmConfig(
        cli.output_dir,
        policy_args=fast_es_config(cli.output_dir, **phase),
        rubric_args=fast_es_config(cli.output_dir, **phase),
        rounds=1,
        replay_min_age=0,
        max_judge_failure_rate=1.0,
        rubric_temperature=MOVING["temperature"],  # the ES rubric phase samples its rubrics as policy phases read them
    )
    questions = Dataset.from_dict({"question": [f"What is {k} plus {k}?" for k in range(8)]})
    callbacks = [KillAt(cli.kill_in_phase, cli.kill_at_step)]
    EvolmTrainer(cli.model, TextJudge(), args, questions, callbacks=callbacks).train()


if __name__ == "__main__":
    main()
