"""Train the tiny model and push it to the Hub that HF_ENDPOINT names: ESTrainer, then a SequentialTrainer.

Used by tests/integration/test_hub_push.py, with HF_ENDPOINT on a FakeHub (tests/hub_server.py):
    python push_to_hub.py MODEL WORK_DIR
- `es-tiny`: ESTrainer with `push_to_hub=True` and `hub_strategy="checkpoint"` (a push at every save, the last
  checkpoint under `last-checkpoint/`), then `trainer.push_to_hub(dataset_name=...)`; with what must not be
  published: the Hub token as `hub_token`, a token in `model_init_kwargs` ($MODEL_TOKEN: the local load ignores it),
  a `vllm_server_secret_file` under WORK_DIR, and TensorBoard logs in `output_dir/runs/`;
- `es-tiny-logs`: the same settings with `hub_push_logs=True`, pushed once, at the end: its `runs/` go too;
- `es-tiny-branch`: a run with `push_to_hub=True, hub_revision="es-branch"`: every save and the end of training
  pushed to a branch of a new repo;
- `es-then-grpo-tiny`: SequentialTrainer (ES then GRPO, both stages loading with the token in `model_init_kwargs`,
  the GRPO stage given `hub_token`) pushed without its stages, and `es-then-grpo-tiny-stages` with them
  (`include_stages=True`), to branch `stages`;
- `es-then-grpo-cli`: the same sequence pushed as `trl-es es-then-grpo --push_to_hub --hub_model_id es-then-grpo-cli
  --hub_revision cli --dataset_name ...` pushes it (`train_and_push`: its stages are done, so it only pushes).
For each ES run, WORK_DIR/locked_at_saves.json says whether its output_dir lock was there at each save's push.
"""

import argparse
import json
import os
from pathlib import Path

from fast_es import fast_es_config, fast_grpo_config
from transformers import TrainerCallback

from trl_es import ESTrainer
from trl_es.cli.sequential import train_and_push
from trl_es.sequential.trainer import SequentialTrainer
from trl_es.testing import digit_fraction, digit_prompts
from trl_es.trainer.output_lock import LOCK_FILE

DATASET = "trl-lib/digits"
# In WORK_DIR, beside the runs: for each ES run, whether its output_dir lock was there at each save (and push).
LOCKED_AT_SAVES = "locked_at_saves.json"


class WaitForPush(TrainerCallback):
    """Let each checkpoint's push finish before training goes on, so the commits are a fixed list; and note whether
    the run's output_dir lock was there when the save's push chose its files (`locked_at_saves`).

    The Trainer pushes in the background and skips a save's push while the previous one still runs; with
    `hub_always_push=True` it pushes anyway, and the next save can rewrite `output_dir` while the earlier push reads
    it (the Hub then refuses that upload). On a loaded machine either way loses a commit."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.locked_at_saves = []

    def on_save(self, args, state, control, **kwargs):
        self.locked_at_saves.append((Path(args.output_dir) / LOCK_FILE).is_file())
        if self.trainer.push_in_progress is not None:
            self.trainer.push_in_progress.wait_until_done()


def train_and_push_es(model: str, output_dir: str, **hub_settings) -> list[bool]:
    """An ESTrainer run that pushes at every save (waiting for each push; none with `save_strategy="no"`), then
    `push_to_hub` at the end. Returns, for each save, whether the output_dir lock was there."""
    hub_settings = {"save_strategy": "steps", "save_steps": 1, **hub_settings}
    args = fast_es_config(output_dir, push_to_hub=True, **hub_settings)
    trainer = ESTrainer(model=model, reward_funcs=digit_fraction, args=args, train_dataset=digit_prompts(8))
    pushes = WaitForPush(trainer)
    trainer.add_callback(pushes)
    trainer.train()
    trainer.push_to_hub(dataset_name=DATASET)
    return pushes.locked_at_saves


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("work_dir")
    cli = parser.parse_args()

    # The token given as `hub_token`, as `--hub_token` would, and one in `model_init_kwargs`: no file saved or pushed
    # may hold either, nor a path of this machine (the secret file is never read: there is no vLLM server).
    token = os.environ["HF_TOKEN"]
    model_kwargs = {"token": os.environ["MODEL_TOKEN"]}
    private = dict(
        report_to=["tensorboard"],
        model_init_kwargs=model_kwargs,
        vllm_server_secret_file=f"{cli.work_dir}/vllm-server.secret",
    )
    locked_at_saves = {
        "es-tiny": train_and_push_es(
            cli.model, f"{cli.work_dir}/es-tiny", hub_strategy="checkpoint", hub_token=token, **private
        ),
        # Pushed at the end only: a push at each save would upload the event file while training writes to it.
        "es-tiny-logs": train_and_push_es(
            cli.model, f"{cli.work_dir}/es-tiny-logs", save_strategy="no", hub_push_logs=True, **private
        ),
        # Every checkpoint to the branch `hub_revision` of a new repo: the trainer creates both.
        "es-tiny-branch": train_and_push_es(cli.model, f"{cli.work_dir}/es-tiny-branch", hub_revision="es-branch"),
    }
    Path(cli.work_dir, LOCKED_AT_SAVES).write_text(json.dumps(locked_at_saves))

    sequence = SequentialTrainer(
        model=cli.model,
        stages=[
            fast_es_config(cli.work_dir, max_steps=1, per_device_train_batch_size=2, model_init_kwargs=model_kwargs),
            fast_grpo_config(
                cli.work_dir,
                max_steps=1,
                per_device_train_batch_size=2,
                hub_token=token,
                model_init_kwargs=model_kwargs,
            ),
        ],
        output_dir=f"{cli.work_dir}/es-then-grpo-tiny",
        reward_funcs=digit_fraction,
        train_dataset=digit_prompts(8),
    )
    sequence.train()
    sequence.push_to_hub("es-then-grpo-tiny", dataset_name=DATASET)
    sequence.push_to_hub("es-then-grpo-tiny-stages", include_stages=True, revision="stages", dataset_name=DATASET)
    cli_args = fast_es_config(cli.work_dir, push_to_hub=True, hub_model_id="es-then-grpo-cli", hub_revision="cli")
    train_and_push(sequence, cli_args, dataset_name=DATASET)
    print("PUSHED")


if __name__ == "__main__":
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    main()
