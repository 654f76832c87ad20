"""An ES run on the Hub: its model card (TRL's, with the ES papers, the rewards and every run setting explained) and
the branch a `hub_revision` run pushes to."""

from __future__ import annotations

from pathlib import Path

from ..compat.trl import tracker_urls
from .model_card import es_hyperparameters, es_papers, generate_es_model_card, hub_id_or_none


def write_model_card(trainer, model_name: str | None, dataset_name: str | None, tags) -> None:
    """Write `README.md` in `trainer.args.output_dir`: the card of an ESTrainer run (from the main process only)."""
    if not trainer.is_world_process_zero():
        return
    args = trainer.args
    base_model = hub_id_or_none(trainer.model.config.name_or_path or None)  # a local path stays private
    tags = {tags} if isinstance(tags, str) else set(tags or ())
    card = generate_es_model_card(
        base_model=base_model,
        model_name=model_name or Path(args.output_dir).name,
        hub_model_id=trainer.hub_model_id,
        dataset_name=dataset_name,
        tags=sorted(tags | set(trainer.model_tags)),
        hyperparameters=es_hyperparameters(args),
        reward_functions=trainer.reward_func_names,
        reward_weights=trainer.reward_weights.tolist(),
        papers=es_papers(args),
        **tracker_urls(),
    )
    card.save(Path(args.output_dir) / "README.md")


def create_revision_branch(repo_id: str, revision: str | None, token: str | None) -> None:
    """Create the `hub_revision` branch (from `main`) when the repository lacks it: the Hub refuses commits to a
    missing branch, and the checkpoint pushes would fail unseen in the background. Pull-request refs are left
    alone."""
    if revision is None or revision.startswith("refs/pr/"):
        return
    from huggingface_hub import HfApi

    HfApi().create_branch(repo_id, branch=revision, token=token, exist_ok=True)
