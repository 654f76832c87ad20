"""What a run's settings show once they leave the process: no secret anywhere (logs, pickles, cards), and no local path
where they are published (loggers' hyperparameters, the model card).

A secret is the value of a key named like one (`is_secret_key`: `token`, `*_token`, `api_key`, `authorization`, ...,
in any case) at any depth of a setting's dicts and lists (`model_init_kwargs={"token": ...}`), or text that holds a
Hugging Face token (`hf_` and 30 or more letters and digits) under any key. A local path is text that is absolute or
starts at the home folder (`/data/me/run`, `~/.cache/x`, `C:\\runs\\x`); published, it is shown by its last
component (`run`), which names the folder without saying where on the machine it is.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Callable
from pathlib import PurePosixPath, PureWindowsPath
from typing import Any

SECRET_KEY = re.compile(r"(?:^|[_-])(?:token|api_key|apikey|secret|password)$|^authorization$", re.IGNORECASE)
HF_TOKEN = re.compile(r"hf_[A-Za-z0-9]{30,}")
_WINDOWS_PATH = re.compile(r"^(?:[A-Za-z]:[\\/]|\\\\)")


def is_secret_key(key: object) -> bool:
    """Whether a setting named `key` holds a secret: `token`, `hub_token` or any `*_token`, `api_key` (`*_api_key`),
    `secret` (`*_secret`), `password`, `authorization`, in any case."""
    return isinstance(key, str) and SECRET_KEY.search(key) is not None


def placeholder(key: str) -> str:
    """What stands for a secret in what is logged, as transformers writes `hub_token`: `<HUB_TOKEN>`, `<TOKEN>`."""
    return f"<{key.upper()}>"


def without_secrets(value: Any, replace: Callable[[str], Any] = placeholder) -> Any:
    """`value` with every secret replaced by `replace(key)`, at any depth of its dicts, lists and tuples (copied; the
    argument is left as it was). Under a secret key, None and booleans stay (`token=True` asks for the saved login);
    text holding a Hugging Face token is replaced under any key, as `replace("token")`."""
    if isinstance(value, dict):
        return {
            key: _secret_or_none(key, item, replace) if is_secret_key(key) else without_secrets(item, replace)
            for key, item in value.items()
        }
    if type(value) in (list, tuple):
        return type(value)(without_secrets(item, replace) for item in value)
    if isinstance(value, str) and HF_TOKEN.search(value):
        return replace("token")
    return value


def _secret_or_none(key: str, value: Any, replace: Callable[[str], Any]) -> Any:
    return value if value is None or isinstance(value, bool) else replace(key)


def is_local_path(text: str) -> bool:
    """Whether `text` is an absolute or home-relative path of this machine (POSIX or Windows)."""
    return "\n" not in text and (text.startswith(("/", "~")) or _WINDOWS_PATH.match(text) is not None)


def public_path(text: str) -> str:
    """A local path by its last component (`/home/me/runs/es-tiny` -> `es-tiny`); other text as it is."""
    if not is_local_path(text):
        return text
    name = (PureWindowsPath(text) if _WINDOWS_PATH.match(text) else PurePosixPath(text)).name
    return name or text  # `/` or `~` alone says nothing of the machine


def without_local_paths(value: Any) -> Any:
    """`value` with every local path (`is_local_path`) shown by its last component, at any depth of its dicts, lists
    and tuples (copied)."""
    if isinstance(value, dict):
        return {key: without_local_paths(item) for key, item in value.items()}
    if type(value) in (list, tuple):
        return type(value)(without_local_paths(item) for item in value)
    return public_path(value) if isinstance(value, str) else value


def public(value: Any) -> Any:
    """A setting (or a dict of settings) as it may be published: secrets as placeholders, local paths by their last
    component."""
    return without_local_paths(without_secrets(value))


def pickle_state(state: dict[str, Any]) -> dict[str, Any]:
    """An object's `__dict__` as its pickle may hold it: every secret None (a config loaded back then logs in as the
    machine it runs on does), everything else as it is, local paths included."""
    return without_secrets(state, replace=lambda key: None)


class SettingsWithoutSecrets:
    """A mixin for `TrainingArguments` dataclasses (placed before them in the bases; the dataclass declared with
    `repr=False`, so that it keeps `__repr__`): what leaves the process holds no secret.

    - the pickle (`training_args.bin`, which transformers writes at every save): every secret None, local paths kept;
    - `to_dict` (what `to_json_string`, `to_sanitized_dict` and every logger record): as transformers gives it, with
      secrets as placeholders and local paths by their last component;
    - `str` and `repr`: secrets hidden at any depth (transformers hides the top-level `*_token` fields only).

    Copies (`copy.copy`, `copy.deepcopy`) keep every value.
    """

    def __getstate__(self) -> dict:
        return pickle_state(self.__dict__)

    def __copy__(self):
        copied = object.__new__(type(self))
        copied.__dict__.update(self.__dict__)
        return copied

    def __deepcopy__(self, memo: dict):
        copied = object.__new__(type(self))
        memo[id(self)] = copied
        copied.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return copied

    def to_dict(self) -> dict:
        """The settings as loggers and `to_json_string` record them: as [`~transformers.TrainingArguments.to_dict`]
        gives them, with every secret at any depth replaced by a placeholder (`<HUB_TOKEN>`, `<TOKEN>`) and every local
        path (`output_dir`, `vllm_server_secret_file`, a path inside `model_init_kwargs`...) by its last component.
        Copy a config with `copy.copy` or `dataclasses.replace`, not through this."""
        return public(super().to_dict())

    def __str__(self) -> str:
        """As `TrainingArguments` prints itself, with the secrets of nested settings hidden too (local paths stay)."""
        settings = without_secrets({spec.name: getattr(self, spec.name) for spec in dataclasses.fields(self)})
        lines = "".join(f"{name}={value},\n" for name, value in sorted(settings.items()))
        return f"{type(self).__name__}(\n{lines})"

    __repr__ = __str__
