"""Hugging Face doc-builder cross-references, as mkdocs links.

`[`~trl.GRPOTrainer`]` (the last name shown) and `[`trl.GRPOTrainer`]` (the whole path shown) link to the Hugging Face
docs page that documents the object, `[`ESConfig`]` and `[`~ESConfig.from_grpo_config`]` to our API reference (an
autoref, checked by `mkdocs build --strict`). Used on docstrings (`hf_docstrings.py`) and on the pages (`build.py`).
"""

from __future__ import annotations

import logging
import re

logger = logging.getLogger("mkdocs.plugins.trl_es_docs")

# library -> {top-level object: docs page}; a reference to anything else of these libraries is a warning, so a new
# one gets its page here instead of a dead link.
HF_DOCS = {
    "trl": {"GRPOConfig": "grpo_trainer", "GRPOTrainer": "grpo_trainer", "TrlParser": "script_utils"},
    "transformers": {
        "Trainer": "main_classes/trainer",
        "TrainingArguments": "main_classes/trainer",
        "TrainerCallback": "main_classes/callback",
        "EarlyStoppingCallback": "main_classes/callback",
        "PreTrainedModel": "main_classes/model",
        "PreTrainedTokenizerBase": "main_classes/tokenizer",
    },
    "datasets": {"load_dataset": "package_reference/loading_methods", "Dataset": "package_reference/main_classes"},
    "huggingface_hub": {"CommitInfo": "package_reference/hf_api", "HfApi": "package_reference/hf_api"},
    "accelerate": {"Accelerator": "package_reference/accelerator"},
}

REFERENCE = re.compile(r"\[`(?P<tilde>~?)(?P<name>[A-Za-z_][\w.]*)`\](?![\[(])")


def hf_url(name: str) -> str | None:
    """The Hugging Face docs URL of `library.Object[.member]`, or None if the object is not in HF_DOCS."""
    library, _, rest = name.partition(".")
    page = HF_DOCS.get(library, {}).get(rest.split(".")[0])
    return None if page is None else f"https://huggingface.co/docs/{library}/{page}#{name}"


def convert_refs(text: str, where: str, resolve, warn: bool = True) -> str:
    """`text` with every doc-builder reference replaced. `resolve(name)` gives the autoref identifier of one of our
    names (`trl_es.ESConfig...`), `""` for one of ours without an API page (shown as code), None for an unknown one.
    With `warn`, a reference that cannot be linked is a warning (text that no page shows passes `warn=False`)."""

    def replace(match: re.Match) -> str:
        name = match["name"]
        shown = f"`{name.rsplit('.', 1)[-1] if match['tilde'] else name}`"
        if name.split(".")[0] in HF_DOCS:
            url = hf_url(name)
            if url is None:
                if warn:
                    logger.warning(
                        f"{where}: no Hugging Face docs page known for [`{name}`]; add it to HF_DOCS in {__file__}"
                    )
                return shown
            return f"[{shown}]({url})"
        identifier = resolve(name)
        if identifier is None:
            if warn:
                logger.warning(f"{where}: [`{name}`] names nothing in trl_es or in {', '.join(HF_DOCS)}")
            return shown
        return f"[{shown}][{identifier}]" if identifier else shown

    return REFERENCE.sub(replace, text)


def plain_refs(text: str) -> str:
    """`text` with every doc-builder reference replaced by its shown name, without a link (types, titles)."""
    return REFERENCE.sub(lambda m: m["name"].rsplit(".", 1)[-1] if m["tilde"] else m["name"], text)


def resolver(public: set[str], ours: set[str] = frozenset()):
    """`resolve` for convert_refs: names in `public` (trl_es.__all__) get autorefs, other names in `ours` code."""

    def resolve(name: str) -> str | None:
        head = name.split(".")[0]
        if head in public:
            return f"trl_es.{name}"
        return "" if head in ours else None

    return resolve


def python_names(package) -> tuple[set[str], set[str]]:
    """(the names in the griffe package's `__all__`, the names of every class and function defined in it)."""
    ours: set[str] = set()

    def walk(obj) -> None:
        for member in obj.members.values():
            if member.is_alias:
                continue
            if member.is_class or member.is_function:
                ours.add(member.name)
            if member.is_module or member.is_class:
                walk(member)

    walk(package)
    return set(package.exports or ()), ours
