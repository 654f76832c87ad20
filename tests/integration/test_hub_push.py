"""What lands on the Hub when ESTrainer and SequentialTrainer push: files, cards, commit messages, branches, and
nothing private. The pushes run in a subprocess whose `huggingface_hub` talks HTTP to a FakeHub on 127.0.0.1
(tests/hub_server.py) through HF_ENDPOINT, as it would talk to the Hub; tests/scripts/push_to_hub.py says what it
pushes."""

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hub_server import FakeHub
from huggingface_hub import ModelCard
from scripts.paths import SCRIPTS

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


@pytest.fixture(scope="module")
def pushed(tiny_model_path, tmp_path_factory):
    """(hub, work_dir) after the script trained and pushed everything."""
    work_dir = tmp_path_factory.mktemp("push")
    with FakeHub() as hub:
        run = subprocess.run(
            [sys.executable, str(SCRIPT), tiny_model_path, str(work_dir)],
            env={**os.environ, **hub.client_env()},
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


def test_no_pushed_file_holds_the_token_or_a_local_path(pushed, tiny_model_path):
    hub, work_dir = pushed
    token = hub.token.encode()
    # The run's folders and the base model's: a card or config naming them would publish a local path.
    local = [str(work_dir).encode(), str(Path(tiny_model_path).resolve()).encode(), tiny_model_path.encode()]
    for commit in hub.commits:
        for path, content in commit.added.items():
            assert token not in content, (commit.repo_id, path)
            # training_args.bin is transformers' pickle of the whole ESConfig, output_dir included, as every Trainer
            # pushes it (without the hub_token the run was given).
            if Path(path).name != "training_args.bin":
                assert not [folder for folder in local if folder in content], (commit.repo_id, path)
    writes = [auth for method, _, auth in hub.requests if method == "POST"]
    assert writes and all(auth == f"Bearer {hub.token}" for auth in writes)  # the token travels in headers only


def test_the_clients_used_only_the_hub_endpoints_an_upload_needs(pushed):
    hub, _ = pushed
    assert hub.unexpected == []
