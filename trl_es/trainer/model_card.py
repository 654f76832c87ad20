"""Model cards for ES checkpoints: TRL's card, with the ES hyperparameters and the ES papers."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from huggingface_hub import ModelCard, ModelCardData

TEMPLATE_NAME = "es_model_card.md"
SEQUENTIAL_TEMPLATE_NAME = "sequential_model_card.md"

# The ES fields and the generation fields that decide what a member is scored on.
CARD_HYPERPARAMETERS = (
    "population_size",
    "sigma",
    "perturbation",
    "learning_rate",
    "lr_scheduler_type",
    "antithetic",
    "fitness_shaping",
    "weight_decay",
    "num_generations",
    "temperature",
    "max_completion_length",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "max_steps",
    "num_train_epochs",
    "seed",
)


def template_path(name: str = TEMPLATE_NAME) -> Path:
    """A card template: shipped inside the wheel, or in the repository's `model_cards/` for a source checkout."""
    package = Path(__file__).parents[1]
    packaged = package / "model_cards" / name
    return packaged if packaged.is_file() else package.parent / "model_cards" / name


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "unknown"


# What a GRPO stage's line in a sequential card shows.
GRPO_CARD_HYPERPARAMETERS = (
    "learning_rate",
    "beta",
    "loss_type",
    "num_generations",
    "temperature",
    "max_completion_length",
    "per_device_train_batch_size",
    "max_steps",
    "seed",
)


LOWRANK_CARD_HYPERPARAMETERS = ("lowrank_rank", "lowrank_other_parameters")


def es_hyperparameters(args) -> dict[str, object]:
    """The card's hyperparameter table, read from an `ESConfig`."""
    names = CARD_HYPERPARAMETERS + (LOWRANK_CARD_HYPERPARAMETERS if args.perturbation == "lowrank" else ())
    return {name: getattr(args, name) for name in names}


def stage_hyperparameters(args) -> dict[str, object]:
    """An ES or GRPO stage's hyperparameters, for the sequential card."""
    from .es_config import ESConfig

    if isinstance(args, ESConfig):
        return es_hyperparameters(args)
    return {name: getattr(args, name) for name in GRPO_CARD_HYPERPARAMETERS}


def _render(template_name: str, card_data: ModelCardData, **context) -> ModelCard:
    """Fill a template of `model_cards/` with `context` and the framework versions."""
    return ModelCard.from_template(
        card_data,
        template_path=str(template_path(template_name)),
        trl_es_version=_version("trl-es"),
        trl_version=_version("trl"),
        transformers_version=_version("transformers"),
        pytorch_version=_version("torch"),
        **context,
    )


def generate_sequential_model_card(
    *, base_model: str | None, model_name: str, stages: list[dict], tags: list[str]
) -> ModelCard:
    """`stages`: one `{"method": "ES" | "GRPO", "hyperparameters": {...}}` per stage, in order."""
    card_data = ModelCardData(
        base_model=base_model,
        library_name="transformers",
        model_name=model_name,
        tags=["generated_from_trainer", *tags],
    )
    return _render(SEQUENTIAL_TEMPLATE_NAME, card_data, base_model=base_model, model_name=model_name, stages=stages)


def generate_es_model_card(
    *,
    base_model: str | None,
    model_name: str,
    hub_model_id: str | None,
    dataset_name: str | None,
    tags: list[str],
    hyperparameters: dict[str, object],
    wandb_url: str | None = None,
    trackio_url: str | None = None,
) -> ModelCard:
    card_data = ModelCardData(
        base_model=base_model,
        datasets=dataset_name,
        library_name="transformers",
        model_name=model_name,
        tags=["generated_from_trainer", *tags],
    )
    return _render(
        TEMPLATE_NAME,
        card_data,
        base_model=base_model,
        model_name=model_name,
        hub_model_id=hub_model_id or model_name,
        dataset_name=dataset_name,
        wandb_url=wandb_url,
        trackio_url=trackio_url,
        hyperparameters=hyperparameters,
    )
