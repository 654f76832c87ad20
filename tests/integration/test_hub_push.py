"""What lands on the Hub when ESTrainer and SequentialTrainer push: files, cards, commit messages, branches, and
nothing private. The pushes run in a subprocess whose `huggingface_hub` talks HTTP to a FakeHub on 127.0.0.1
(tests/hub_server.py) through HF_ENDPOINT, as it would talk to the Hub; tests/scripts/push_to_hub.py says what it
pushes."""

import hashlib
import json
import os
import random
import string
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hub_server import FakeHub
from huggingface_hub import ModelCard
from scripts.paths import SCRIPTS

from trl_es.trainer.output_lock import LOCK_FILE

SCRIPT = SCRIPTS / "push_to_hub.py"
MODEL_FILES = {
    "README.md",
    "chat_template.jinja",
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
}


# A token for the model's loading (`model_init_kwargs`), which no saved or pushed file may hold.
MODEL_TOKEN = "hf_" + "".join(random.Random(27).choices(string.ascii_letters, k=30))
# The ES runs (ESTrainer) of the script, each in its folder of the work dir.
ES_RUNS = ("es-tiny", "es-tiny-logs", "es-tiny-branch")


@pytest.fixture(scope="module")
def pushed(tiny_model_path, tmp_path_factory):
    """(hub, work_dir) after the script trained and pushed everything."""
    work_dir = tmp_path_factory.mktemp("push")
    with FakeHub() as hub:
        run = subprocess.run(
            [sys.executable, str(SCRIPT), tiny_model_path, str(work_dir)],
            env={**os.environ, **hub.client_env(), "MODEL_TOKEN": MODEL_TOKEN},
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert run.returncode == 0 and "PUSHED" in run.stdout, run.stderr[-4000:]
    return hub, work_dir


def repo(hub, name):
    return f"{hub.user}/{name}"


def test_es_pushes_the_weights_config_tokenizer_and_card_of_the_run(pushed):
    hub, work_dir = pushed
    files = hub.files(repo(hub, "es-tiny"))
    assert MODEL_FILES <= set(files)
    assert files["model.safetensors"] == (work_dir / "es-tiny" / "model.safetensors").read_bytes()
    assert hashlib.sha256(files["model.safetensors"]).hexdigest() in hub.lfs  # the weights travelled through LFS
    assert not any(path.startswith("checkpoint-") for path in files)


def test_es_checkpoint_pushes_carry_the_es_state_of_the_last_checkpoint(pushed):
    hub, work_dir = pushed
    files = hub.files(repo(hub, "es-tiny"))
    checkpoint = work_dir / "es-tiny" / "checkpoint-2"
    for name in ("es_state/es_state.json", "es_state/master.safetensors", "es_state/reference.safetensors"):
        assert files[f"last-checkpoint/{name}"] == (checkpoint / name).read_bytes(), name
    assert files["last-checkpoint/trainer_state.json"] == (checkpoint / "trainer_state.json").read_bytes()


def test_es_commits_say_what_they_push(pushed):
    hub, _ = pushed
    assert [commit.summary for commit in hub.commits_to(repo(hub, "es-tiny"))] == [
        "initial commit",
        "Training in progress, step 1",
        "Training in progress, step 1, checkpoint",
        "Training in progress, step 2",
        "Training in progress, step 2, checkpoint",
        "End of training",
    ]


def test_the_es_card_names_the_method_dataset_rewards_and_hyperparameters(pushed):
    hub, _ = pushed
    card = ModelCard(hub.files(repo(hub, "es-tiny"))["README.md"].decode())
    assert card.data.datasets == "trl-lib/digits" and card.data.base_model is None  # a local base model
    assert {"trl", "trl-es", "es"} <= set(card.data.tags)
    assert "fine-tuned from a local checkpoint on the [trl-lib/digits]" in card.text
    assert "(https://huggingface.co/papers/2509.24372)" in card.text
    assert "Reward functions: `digit_fraction`." in card.text
    assert "| `population_size` | `4` |" in card.text and "| `lr_scheduler_type` | `constant` |" in card.text
    assert "| `model_init_kwargs` | `{'token': '<TOKEN>'}` |" in card.text  # the setting, its token hidden
    assert f'model="{repo(hub, "es-tiny")}"' in card.text


def test_hub_revision_pushes_to_its_branch_and_leaves_main_alone(pushed):
    hub, _ = pushed
    branch_repo = repo(hub, "es-tiny-branch")
    assert [(c.revision, c.summary) for c in hub.commits_to(branch_repo)] == [
        ("main", "initial commit"),
        ("es-branch", "Training in progress, step 1"),
        ("es-branch", "Training in progress, step 2"),
        ("es-branch", "End of training"),
    ]
    assert set(hub.files(branch_repo)) == {".gitattributes"}
    assert MODEL_FILES <= set(hub.files(branch_repo, "es-branch"))


def test_a_sequential_push_is_one_commit_of_the_final_model_and_its_card(pushed):
    hub, work_dir = pushed
    sequential = repo(hub, "es-then-grpo-tiny")
    assert [c.summary for c in hub.commits_to(sequential)] == ["initial commit", "ES → GRPO with trl-es: final model"]
    files = hub.files(sequential)
    final = work_dir / "es-then-grpo-tiny" / "stage-1-grpo" / "final"
    assert MODEL_FILES <= set(files) and not any(path.startswith("stage-") for path in files)
    assert "training_args.bin" not in files  # a stage's pickled config: local paths, a GRPO stage's hub_token
    assert files["model.safetensors"] == (final / "model.safetensors").read_bytes()
    card = ModelCard(files["README.md"].decode())
    assert card.data.datasets == "trl-lib/digits" and {"es", "grpo"} <= set(card.data.tags)
    assert "| 0 | ES | `digit_fraction` |" in card.text and "| 1 | GRPO | `digit_fraction` |" in card.text
    assert "| `model_init_kwargs` | `{'token': '<TOKEN>'}` |" in card.text  # the ES stage's table
    assert "(https://huggingface.co/papers/2402.03300)" in card.text and "subfolder" not in card.text


def test_a_sequential_push_with_stages_puts_each_stage_model_in_its_folder_on_the_branch(pushed):
    hub, work_dir = pushed
    with_stages = repo(hub, "es-then-grpo-tiny-stages")
    assert [(c.revision, c.summary) for c in hub.commits_to(with_stages)] == [
        ("main", "initial commit"),
        ("stages", "ES → GRPO with trl-es: final model and every stage's"),
    ]
    files = hub.files(with_stages, "stages")
    run = work_dir / "es-then-grpo-tiny"
    for stage in ("stage-0-es", "stage-1-grpo"):
        stage_files = {path.split("/", 1)[1] for path in files if path.startswith(f"{stage}/")}
        assert MODEL_FILES - {"README.md"} <= stage_files, stage  # the card is the repository's, at its root
        assert files[f"{stage}/model.safetensors"] == (run / stage / "final" / "model.safetensors").read_bytes()
    assert files["model.safetensors"] == files["stage-1-grpo/model.safetensors"]
    assert 'subfolder="stage-0-es"' in files["README.md"].decode()


def test_the_sequential_command_pushes_to_its_revision_with_the_dataset_in_the_card(pushed):
    hub, _ = pushed
    cli_repo = repo(hub, "es-then-grpo-cli")
    assert [(c.revision, c.summary) for c in hub.commits_to(cli_repo)] == [
        ("main", "initial commit"),
        ("cli", "ES → GRPO with trl-es: final model"),
    ]
    files = hub.files(cli_repo, "cli")
    assert MODEL_FILES <= set(files) and ModelCard(files["README.md"].decode()).data.datasets == "trl-lib/digits"
    assert set(hub.files(cli_repo)) == {".gitattributes"}


def local_paths(work_dir, tiny_model_path) -> list[bytes]:
    """The run's folders, the base model's and the temporary folder's: a file naming one would publish a local path."""
    folders = [work_dir, Path(work_dir).resolve(), tiny_model_path, Path(tiny_model_path).resolve()]
    return [str(folder).encode() for folder in folders] + [os.path.join(tempfile.gettempdir(), "").encode()]


def test_no_pushed_file_holds_the_token_or_a_local_path(pushed, tiny_model_path):
    hub, work_dir = pushed
    secrets = [hub.token.encode(), MODEL_TOKEN.encode()]
    local = local_paths(work_dir, tiny_model_path)
    pushed_files = [
        (commit.repo_id, path, content) for commit in hub.commits for path, content in commit.added.items()
    ]
    assert len(pushed_files) > 50 and any("tfevents" in path for _, path, _ in pushed_files)
    for repo_id, path, content in pushed_files:  # every version of every file, TensorBoard's event files included
        assert not [secret for secret in secrets if secret in content], (repo_id, path)
        assert not [folder for folder in local if folder in content], (repo_id, path)
    writes = [auth for method, _, auth in hub.requests if method == "POST"]
    assert writes and all(auth == f"Bearer {hub.token}" for auth in writes)  # the token travels in headers only


def test_no_pickled_arguments_are_pushed(pushed):
    """`training_args.bin` is transformers' pickle of the config: loading one from the Hub runs its code, and it holds
    this machine's paths; the card lists the settings instead."""
    hub, _ = pushed
    assert not [
        (commit.repo_id, path)
        for commit in hub.commits
        for path in commit.added
        if Path(path).name == "training_args.bin"
    ]


def test_no_saved_file_of_an_es_run_holds_a_token(pushed):
    """`training_args.bin` of the run and of every checkpoint, the TensorBoard event files, the card, the ES state."""
    hub, work_dir = pushed
    secrets = [hub.token.encode(), MODEL_TOKEN.encode()]
    saved = [path for run in ES_RUNS for path in (work_dir / run).rglob("*") if path.is_file()]
    names = {path.name for path in saved}
    assert {"training_args.bin", "README.md", "es_state.json"} <= names and any("tfevents" in n for n in names)
    assert not [path for path in saved if [secret for secret in secrets if secret in path.read_bytes()]]


def test_the_output_dir_lock_is_in_no_pushed_commit(pushed):
    """The checkpoint pushes upload output_dir while the run holds its lock there; the lock file stays local."""
    hub, work_dir = pushed
    # Whether the lock was there at each save of the runs that push at every save (the script writes it).
    locked_at_saves = json.loads((work_dir / "locked_at_saves.json").read_text())
    assert locked_at_saves["es-tiny"] == locked_at_saves["es-tiny-branch"] == [True, True]
    assert not [
        (commit.repo_id, path) for commit in hub.commits for path in commit.added if LOCK_FILE in Path(path).name
    ]
    assert not list(work_dir.rglob(LOCK_FILE))  # released once each run ended


def test_tensorboard_logs_stay_local_unless_hub_push_logs_asks(pushed):
    hub, work_dir = pushed
    assert list((work_dir / "es-tiny" / "runs").rglob("events.out.tfevents.*"))  # logged, here
    for name in ("es-tiny", "es-tiny-branch"):
        revision = "es-branch" if name == "es-tiny-branch" else "main"
        assert not [path for path in hub.files(repo(hub, name), revision) if path.startswith("runs/")], name
    events = {path: content for path, content in hub.files(repo(hub, "es-tiny-logs")).items() if "tfevents" in path}
    [(path, content)] = events.items()
    assert path.startswith("runs/") and content == (work_dir / "es-tiny-logs" / path).read_bytes()
    # TensorBoard's record of the config is there, its token and paths hidden.
    assert b'"token": "<TOKEN>"' in content and b'"output_dir": "es-tiny-logs"' in content
    assert b'"vllm_server_secret_file": "vllm-server.secret"' in content


def test_the_clients_used_only_the_hub_endpoints_an_upload_needs(pushed):
    hub, _ = pushed
    assert hub.unexpected == []
