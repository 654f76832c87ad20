"""The command-line reference, generated from the `trl-es` command's own argparse parsers at build time.

`render()` returns Markdown: every subcommand of `trl_es.cli.main.build_parser()` with its usage and options, and for
the training commands (`trl-es es`, `es-then-grpo`, ...) the parser of the script they launch (`make_parser` of
`trl_es/cli/<script>.py`): its own flags in full, ESConfig's own fields, and the names of the GRPOConfig /
TrainingArguments and `trl.ModelConfig` flags it also takes. Nothing here is copied by hand.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import re
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from refs import plain_refs  # noqa: E402

# Dataclasses whose flags are listed by name only, with where they are documented.
LIBRARY_CONFIGS = {
    "ModelConfig": "TRL's `ModelConfig` (model loading, PEFT)",
    "DatasetMixtureConfig": "TRL's `DatasetMixtureConfig` (dataset mixtures)",
}


def _cell(text: object) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if not action.help or action.help == argparse.SUPPRESS:
        return ""
    text = parser._get_formatter()._expand_help(action)  # argparse's own %(default)s expansion
    return re.sub(r"\s*\(default: [^()]*\)$", "", text)  # HfArgumentParser's suffix: the default has a column


def _default(action: argparse.Action) -> str:
    if action.nargs == argparse.REMAINDER:
        return ""
    if action.required:
        return "required"
    default = action.default
    if default in (None, argparse.SUPPRESS, []) or isinstance(action, argparse._HelpAction):
        return ""
    return f"`{default}`"


def _flag(action: argparse.Action, siblings: list[argparse.Action]) -> str:
    if not action.option_strings:  # a positional argument
        return f"`{action.metavar or action.dest}`" + (" ..." if action.nargs in ("+", "*", "...") else "")
    names = [name for other in siblings if other.dest == action.dest for name in other.option_strings]
    # HfArgumentParser adds `--a-b` beside every `--a_b`; both work (the page says so once) and only `--a_b` is shown
    names = [name for name in names if not ("-" in name[2:] and f"--{name[2:].replace('-', '_')}" in names)]
    shown = " / ".join(f"`{name}`" for name in dict.fromkeys(names))
    if action.choices and not isinstance(action, argparse._SubParsersAction):
        shown += " {" + ", ".join(f"`{choice}`" for choice in action.choices) + "}"
    return shown


def _table(parser: argparse.ArgumentParser, actions: list[argparse.Action]) -> list[str]:
    rows, seen = [], set()
    for action in actions:
        if isinstance(action, (argparse._SubParsersAction,)) or action.help == argparse.SUPPRESS:
            continue
        if action.dest in seen:  # `--no_x` beside `--x`: one row
            continue
        seen.add(action.dest)
        rows.append(f"| {_flag(action, parser._actions)} | {_default(action)} | {_cell(_help(parser, action))} |")
    if not rows:
        return []
    return ["| argument | default | description |", "| --- | --- | --- |", *rows, ""]


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            return [(name, helps.get(name, "").replace("%%", "%"), sub) for name, sub in action.choices.items()]
    return []


def _usage(parser: argparse.ArgumentParser) -> list[str]:
    usage = parser.format_usage().strip().removeprefix("usage: ")
    return ["```text", usage, "```", ""]


def _plain_command(name: str, help_text: str, parser: argparse.ArgumentParser, level: str) -> list[str]:
    lines = [f"{level} `{parser.prog}`", "", help_text, ""]
    if parser.description and parser.description.strip() != help_text.strip():
        lines += [" ".join(parser.description.split()), ""]
    lines += _usage(parser)
    lines += _table(parser, [a for a in parser._actions if not isinstance(a, argparse._HelpAction)])
    for sub_name, sub_help, sub_parser in _subcommands(parser):
        lines += _plain_command(sub_name, sub_help, sub_parser, level + "#")
    return lines


def _fields(config: type) -> list[str]:
    return [spec.name for spec in dataclasses.fields(config)]


def _training_command(command, help_text: str, documented: dict[str, str]) -> list[str]:
    """A training command: the flags of the script it launches. A dataclass whose flags an earlier command already
    listed (`documented`: dataclass name -> that command's anchor) is a link to them."""
    module = importlib.import_module(f"trl_es.cli.{command.script}")
    parser = module.make_parser(prog=f"trl-es {command.name}")
    by_dest: dict[str, list[argparse.Action]] = {}
    for action in parser._actions:
        by_dest.setdefault(action.dest, []).append(action)
    anchor = f"trl-es-{command.name}"
    fixed = ", ".join(f"`--{name} {value}`" for name, value in command.fixed)
    lines = [f"## `trl-es {command.name}` {{ #{anchor} }}", "", help_text, ""]
    lines += [
        f"Runs `accelerate launch` on `trl_es/cli/{command.script}.py`" + (f" with {fixed}" if fixed else "") + ". "
        "Its flags are the fields of the dataclasses of its parser (`--a-b` works as well as `--a_b`; "
        "`--config FILE.yaml` reads them from a file); the flags it does not take go to `accelerate launch`.",
        "",
    ]
    earlier: dict[str, list[str]] = {}  # command -> dataclasses whose flags it lists
    for config in parser.dataclass_types:
        name = config.__name__
        if name in documented:
            earlier.setdefault(documented[name], []).append(f"`{name}`")
            continue
        documented[name] = command.name
        if name in LIBRARY_CONFIGS:
            lines += _named_only(f"{LIBRARY_CONFIGS[name]}", _fields(config), by_dest)
            continue
        if name == "ESConfig":
            own = list(config.__dict__.get("__annotations__", {}))
            lines += [
                "**ESConfig**, its own fields (new, or with another default than `GRPOConfig`'s; see "
                "[`ESConfig`][trl_es.ESConfig]):",
                "",
            ]
            lines += _table(parser, [by_dest[field][0] for field in own if field in by_dest])
            others = [field for field in _fields(config) if field not in own]
            lines += _named_only(
                "the other fields of `ESConfig`: `GRPOConfig`'s and `TrainingArguments`'", others, by_dest
            )
            continue
        summary = f": {_cell(plain_refs(config.__doc__.strip().splitlines()[0]))}" if config.__doc__ else ""
        lines += [f"**{name}**{summary}", ""]
        lines += _table(parser, [by_dest[field][0] for field in _fields(config) if field in by_dest])
    for other, names in earlier.items():
        lines += [f"And the flags of {', '.join(names)}, listed under [`trl-es {other}`](#trl-es-{other}).", ""]
    return lines


def _named_only(label: str, fields: list[str], by_dest: dict) -> list[str]:
    flags = [f"`--{field}`" for field in fields if field in by_dest]
    return [f'??? note "{len(flags)} flags from {label}"', "", f"    {', '.join(flags)}", ""]


def render() -> str:
    """The Markdown of the command-line reference."""
    with warnings.catch_warnings():  # TRL's notes about the installed vLLM are not the page's business
        warnings.simplefilter("ignore")
        return _render()


def _render() -> str:
    from trl_es.cli.main import TRAINING_COMMANDS, accelerate_config_names, build_parser

    parser = build_parser()
    documented: dict[str, str] = {}
    lines = [
        "`--accelerate_config NAME` takes a path to an accelerate YAML file or one of trl-es's configs: "
        + ", ".join(f"`{name}`" for name in accelerate_config_names())
        + ".",
        "",
    ]
    for name, help_text, sub_parser in _subcommands(parser):
        if name in TRAINING_COMMANDS:
            lines += _training_command(TRAINING_COMMANDS[name], help_text, documented)
        else:
            lines += _plain_command(name, help_text, sub_parser, "##")
    return "\n".join(lines)


if __name__ == "__main__":
    print(render())
