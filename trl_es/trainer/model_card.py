"""Model cards for ES checkpoints: TRL's card, with the papers, the rewards and every ES hyperparameter explained."""

from __future__ import annotations

import dataclasses
import enum
import re
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from huggingface_hub import ModelCard, ModelCardData

from .es_config import ESConfig
from .redaction import is_local_path, public
from .run_settings import card_setting_names

TEMPLATE_NAME = "es_model_card.md"
SEQUENTIAL_TEMPLATE_NAME = "sequential_model_card.md"


@dataclass(frozen=True)
class Paper:
    title: str
    arxiv_id: str
    bibtex: str

    @property
    def url(self) -> str:
        return f"https://huggingface.co/papers/{self.arxiv_id}"


ES_AT_SCALE = Paper(
    "Evolution Strategies at Scale: LLM Fine-Tuning Beyond Reinforcement Learning",
    "2509.24372",
    """@article{qiu2025evolution,
    title   = {{Evolution Strategies at Scale: LLM Fine-Tuning Beyond Reinforcement Learning}},
    author  = {Xin Qiu and others},
    year    = 2025,
    eprint  = {arXiv:2509.24372},
}""",
)
ES_COVERAGE = Paper(
    "Understanding Evolution Strategies for LLM Reasoning: Broader Reasoning Coverage than GRPO",
    "2608.27351",
    """@article{es_coverage2026,
    title   = {{Understanding Evolution Strategies for LLM Reasoning: Broader Reasoning Coverage than GRPO}},
    year    = 2026,
    eprint  = {arXiv:2608.27351},
}""",
)
EGGROLL = Paper(
    "Evolution Strategies at the Hyperscale",
    "2511.16652",
    """@article{sarkar2025eggroll,
    title   = {{Evolution Strategies at the Hyperscale}},
    author  = {Bidipta Sarkar and others},
    year    = 2025,
    eprint  = {arXiv:2511.16652},
}""",
)
GRPO = Paper(
    "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models",
    "2402.03300",
    """@article{shao2024deepseekmath,
    title   = {{DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models}},
    author  = {Zhihong Shao and others},
    year    = 2024,
    eprint  = {arXiv:2402.03300},
}""",
)

# The fields ESConfig declares (or redefines, with an ES meaning), whose help explains them for ES.
ES_OWN_FIELDS = frozenset(ESConfig.__annotations__)

# What a TRL setting means in an ES run, where TRL's help speaks of gradients, devices or library internals.
ES_MEANINGS = {
    "seed": "Seed of the data order (and of the noise when `noise_seed` is unset).",
    "weight_decay": "Decay of the weights towards zero at every ES update.",
    "top_p": "Nucleus sampling: the smallest set of tokens whose probability reaches this.",
    "top_k": "Tokens kept for sampling (0: all).",
    "min_p": "Tokens below this fraction of the likeliest token's probability are dropped.",
    "repetition_penalty": "Penalty on tokens already in the prompt or the completion (1.0: none).",
    "max_completion_length": "Tokens per completion, at most.",
    "generation_kwargs": "Further sampling arguments.",
    "per_device_train_batch_size": "Completions per process per step (`num_generations` per prompt).",
    "gradient_accumulation_steps": "Prompt batches per ES step.",
    "max_steps": "ES steps of the run.",
    "num_train_epochs": "Passes over the training set.",
    "warmup_steps": "Linear warmup of the step size from 0: a number of steps, or a fraction of the run below 1.",
    "use_vllm": "Completions generated with vLLM (otherwise with transformers' `generate`).",
    "vllm_mode": "Where vLLM ran: `colocate` (in the training processes) or `server` (`trl-es vllm-serve`).",
    "cast_lm_head_to_fp32": "The language-modelling head computed in float32.",
    "model_init_kwargs": "Arguments the model was loaded with (`from_pretrained`), such as its dtype.",
}
# The same, for a GRPO stage's line where TRL's first sentence says little.
GRPO_MEANINGS = {
    "max_steps": "Optimizer steps of the stage.",
    "per_device_train_batch_size": "Completions per process per step (`num_generations` per prompt).",
}

# A stage's line in the sequential card's summary table (its section holds the whole table).
ES_STAGE_SUMMARY = ("population_size", "sigma", "learning_rate", "num_generations", "temperature", "max_steps")
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


@dataclass(frozen=True)
class Hyperparameter:
    name: str
    value: str
    meaning: str


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


def readable(value) -> str:
    """A setting as a user would write it: enums by their value (`constant`, not `SchedulerType.CONSTANT`)."""
    if isinstance(value, enum.Enum):
        return str(value.value)
    if value is None:
        return "unset"
    if isinstance(value, (list, tuple)):
        return ", ".join(readable(item) for item in value)
    return str(value)


def _meaning(args, name: str) -> str:
    """What a setting means for the run: ours where TRL's help speaks of gradients or devices or says little, else the
    first sentence of the config field's help (ESConfig's own for the ES fields, TRL's for a GRPO stage)."""
    meanings = ES_MEANINGS if isinstance(args, ESConfig) else GRPO_MEANINGS
    if name in meanings and name not in ES_OWN_FIELDS:
        return meanings[name]
    help_text = next(field.metadata.get("help", "") for field in dataclasses.fields(args) if field.name == name)
    return help_text.split(". ")[0].rstrip(".").replace("|", "\\|") + "."


def _training_length(args) -> tuple[str, ...]:
    return ("max_steps",) if args.max_steps > 0 else ("num_train_epochs",)


def _rows(args, names) -> list[Hyperparameter]:
    """The settings `names` of `args` as the card shows them: published, so with no secret (`model_init_kwargs`'s
    `token` is `<TOKEN>`) and each local path by its last component."""
    return [
        Hyperparameter(name, readable(public(getattr(args, name))), _meaning(args, name))
        for name in names
        if getattr(args, name) not in (None, {})
    ]


def es_hyperparameters(args) -> list[Hyperparameter]:
    """The card's hyperparameter table, read from an `ESConfig`: every setting that decides what the run computed
    (`card_setting_names`) and its length. A setting that is unset (None, or an empty mapping) is left out."""
    return _rows(args, card_setting_names(args) + _training_length(args))


def stage_hyperparameters(args) -> list[Hyperparameter]:
    """An ES or GRPO stage's hyperparameters, for its section of the sequential card."""
    return es_hyperparameters(args) if isinstance(args, ESConfig) else _rows(args, GRPO_CARD_HYPERPARAMETERS)


def stage_summary(args) -> list[Hyperparameter]:
    """The few hyperparameters of a stage's line in the sequential card's table."""
    return _rows(args, ES_STAGE_SUMMARY if isinstance(args, ESConfig) else GRPO_CARD_HYPERPARAMETERS)


def es_papers(args) -> list[Paper]:
    return [ES_AT_SCALE, *([EGGROLL] if args.perturbation == "lowrank" else []), ES_COVERAGE]


def stage_papers(args) -> list[Paper]:
    """The papers of an ES or GRPO stage's method."""
    return es_papers(args) if isinstance(args, ESConfig) else [GRPO]


def reward_function_names(reward_funcs) -> list[str]:
    """How the card names reward functions: a function by its name, a reward model by its Hub id (a local one by its
    folder's name, so that no local path lands in a public card)."""
    funcs = reward_funcs if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    names = []
    for func in funcs:
        if isinstance(func, (str, Path)):
            names.append(str(func) if hub_id_or_none(str(func)) else Path(func).name)
        elif hasattr(func, "config"):
            names.append(str(func.config.name_or_path).split("/")[-1])
        else:
            names.append(getattr(func, "__name__", type(func).__name__))
    return names


def hub_id_or_none(name: str | None) -> str | None:
    """`name` when it can be a Hub id; None for a local path (one that exists here, or any absolute one), which the
    card names without linking (or exposing) it."""
    return None if name is None or Path(name).exists() or is_local_path(name) else name


def _render(template_name: str, card_data: ModelCardData, **context) -> ModelCard:
    """Fill a template of `model_cards/` with `context` and the framework versions; sections that had nothing to say
    leave no blank lines behind."""
    card = ModelCard.from_template(
        card_data,
        template_path=str(template_path(template_name)),
        trl_es_version=_version("trl-es"),
        trl_version=_version("trl"),
        transformers_version=_version("transformers"),
        pytorch_version=_version("torch"),
        **context,
    )
    return ModelCard(re.sub(r"\n[ \t]*(?:\n[ \t]*)+\n", "\n\n", card.content))


def _dataset_context(dataset_name: str | None) -> dict:
    hub_dataset = hub_id_or_none(dataset_name)
    local_dataset = Path(dataset_name).name if dataset_name and hub_dataset is None else None
    return {"dataset_name": hub_dataset, "local_dataset": local_dataset}


def generate_sequential_model_card(
    *,
    base_model: str | None,
    model_name: str,
    hub_model_id: str | None = None,
    dataset_name: str | None = None,
    stages: list[dict],
    tags: list[str],
    stage_folders: list[str] | None = None,
) -> ModelCard:
    """`stages`: one `{"method": "ES" | "GRPO", "summary": [...], "hyperparameters": [...], "reward_functions": [...],
    "papers": [...]}` per stage, in order; `stage_folders`: where each stage's model is in the repository, when it is
    there."""
    context = _dataset_context(dataset_name)
    card_data = ModelCardData(
        base_model=base_model,
        datasets=context["dataset_name"],
        library_name="transformers",
        model_name=model_name,
        tags=["generated_from_trainer", *tags],
    )
    papers = list(dict.fromkeys(paper for stage in stages for paper in stage["papers"]))
    papers = [*papers, *([ES_COVERAGE] if ES_COVERAGE not in papers else [])]
    return _render(
        SEQUENTIAL_TEMPLATE_NAME,
        card_data,
        base_model=base_model,
        model_name=model_name,
        hub_model_id=hub_model_id or model_name,
        stages=stages,
        stage_folders=stage_folders,
        papers=papers,
        es_paper=ES_AT_SCALE,
        grpo_paper=GRPO,
        coverage_paper=ES_COVERAGE,
        **context,
    )


def generate_es_model_card(
    *,
    base_model: str | None,
    model_name: str,
    hub_model_id: str | None,
    dataset_name: str | None,
    tags: list[str],
    hyperparameters: list[Hyperparameter],
    reward_functions: list[str],
    reward_weights: list[float] | None = None,
    papers: list[Paper] = (ES_AT_SCALE, ES_COVERAGE),
    wandb_url: str | None = None,
    trackio_url: str | None = None,
) -> ModelCard:
    context = _dataset_context(dataset_name)
    card_data = ModelCardData(
        base_model=base_model,
        datasets=context["dataset_name"],
        library_name="transformers",
        model_name=model_name,
        tags=["generated_from_trainer", *tags],
    )
    weights = reward_weights or [1.0] * len(reward_functions)
    return _render(
        TEMPLATE_NAME,
        card_data,
        base_model=base_model,
        model_name=model_name,
        hub_model_id=hub_model_id or model_name,
        wandb_url=wandb_url,
        trackio_url=trackio_url,
        hyperparameters=hyperparameters,
        rewards=list(zip(reward_functions, weights, strict=True)),
        weighted=len(set(weights)) > 1,
        papers=list(papers),
        method_paper=papers[0],
        lowrank_paper=EGGROLL if EGGROLL in papers else None,
        **context,
    )
