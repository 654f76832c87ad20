"""Griffe extension: Hugging Face-style docstrings, rendered by mkdocstrings.

trl-es's docstrings follow TRL's conventions, which griffe's Google parser does not read as such. Before parsing:

- cross-references (see `refs.py`): [`~trl.GRPOConfig`] and [`~transformers.Trainer.train`] become links to the
  Hugging Face docs, [`ESConfig`] and [`ESConfig.from_grpo_config`] autorefs to our API pages; a name of ours
  without an API page is shown as code, and an unknown one is a warning (so `mkdocs build --strict` fails);
- parameter headers `name (`int`, *optional*, defaults to `30`):` become `name (int):`; a default the signature does
  not give is added to the description; several names in one header (`a, b (`int`):`) stay one entry, also when
  the names run over two lines;
- TRL's `> Section` lines inside `Parameters:` start a new parameters section titled by them.

Loaded by mkdocstrings from mkdocs.yml (`options.extensions`).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import griffe

sys.path.insert(0, str(Path(__file__).parent))
from refs import convert_refs, plain_refs, python_names, resolver  # noqa: E402

_SECTION = re.compile(
    r"^(?P<indent> *)(?P<kind>Args|Arguments|Parameters|Params|Keyword Args|Other Parameters|Returns|Yields|Raises)"
    r" *: *$"
)
_DEFAULT = re.compile(r"\bdefaults?(?: to)?\s+")
_NAME_AND_TYPE = re.compile(r"^(?P<name>\*{0,2}[A-Za-z_][\w.]*)\s*(?:\((?P<type>.*)\))?$")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def split_top_level(text: str, separator: str = ",") -> list[str]:
    """`text` split at `separator` outside parentheses, brackets and backticks."""
    parts, current = [], []
    for _, char, top_level in _scan(text):
        if char == separator and top_level:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    parts.append("".join(current).strip())
    return [part for part in parts if part]


def header_colon(text: str) -> int:
    """Index of the colon that ends an item's header (outside parentheses, brackets and backticks), or -1."""
    return next((index for index, char, top_level in _scan(text) if char == ":" and top_level), -1)


def _scan(text: str):
    """Each `(index, char, top_level)` of `text`: whether the character stands outside parentheses, brackets and
    backticks."""
    depth, in_code = 0, False
    for index, char in enumerate(text):
        if char == "`":
            in_code = not in_code
        elif not in_code and char in "([":
            depth += 1
        elif not in_code and char in ")]":
            depth -= 1
        yield index, char, depth == 0 and not in_code


def annotation(type_text: str) -> str:
    """HF type text as a Python-like annotation: ``[`ESConfig`] or [`~trl.GRPOConfig`]`` -> `ESConfig | GRPOConfig`,
    ``list` of [`ESConfig`], [`Stage`] or ...`` -> `list[ESConfig | Stage | ...]`."""
    text = plain_refs(type_text).replace("`", "").strip()
    container = re.match(r"^(?P<outer>\w+) of (?P<inner>.+)$", text)
    if container:
        text = container["inner"]
    alternatives = [part for piece in split_top_level(text) for part in re.split(r"\s+or\s+", piece)]
    text = " | ".join(part.strip() for part in alternatives if part.strip())
    return f"{container['outer']}[{text}]" if container else text


def parameter_header(header: str, has_default: set[str]) -> tuple[str, str | None]:
    """(`names (type)`, the default to state in the description or None) of an HF header such as
    ``replay_maxlen, replay_min_age (`int`, *optional*, default `2048`, `20`)``."""
    names, types, default = [], [], None
    for piece in split_top_level(header):
        match = _NAME_AND_TYPE.match(piece)
        if match is None:  # not a list of names: keep the header, without reference syntax
            return plain_refs(header), None
        names.append(match["name"])
        if match["type"] is None:
            continue
        type_text = match["type"]
        if found := _DEFAULT.search(type_text):  # everything after "defaults to" is the default
            default = type_text[found.end() :].strip().rstrip(",").strip()
            type_text = type_text[: found.start()]
        kept = [part for part in split_top_level(type_text) if part.strip("*").lower() != "optional"]
        if kept:
            types.append(annotation(", ".join(kept)))
    if default is not None and len(names) == 1 and names[0] in has_default:
        default = None  # the signature's default is shown beside the name
    name = ", ".join(names)
    return (f"{name} ({' and '.join(types)})" if types else name), default


def _items(block: list[str]) -> tuple[int, list[tuple[str, list[str]]]]:
    """The items of a section's block: (item indent, [(header or '>heading', description lines)])."""
    item_indent = min(_indent(line) for line in block if line.strip())
    items: list[tuple[str, list[str]]] = []
    index = 0
    while index < len(block):
        line = block[index]
        index += 1
        if not line.strip() or _indent(line) != item_indent:
            if items:
                items[-1][1].append(line)
            continue
        header = line.strip()
        if not header.startswith(">"):  # a header may run over several lines before its colon
            while header_colon(header) < 0 and index < len(block):
                following = block[index]
                if not following.strip() or _indent(following) != item_indent:
                    break
                header += " " + following.strip()
                index += 1
        items.append((header, []))
    return item_indent, items


def _section(kind: str, indent: int, block: list[str], path: str, has_default: set[str], refs) -> list[str]:
    item_indent, items = _items(block)
    pad, out = " " * item_indent, [f"{' ' * indent}{kind}:"]
    for header, description in items:
        if header.startswith(">"):  # TRL's `> Section`: a new section of the same kind with that title
            if len(out) == 1 and out[0].endswith(f"{kind}:"):
                out.pop()
            elif out[-1].strip():
                out.append("")
            out.append(f"{' ' * indent}{kind}: {plain_refs(header[1:].strip())}")
            continue
        while description and not description[-1].strip():
            description.pop()
        description = [refs(line) for line in description]
        colon = header_colon(header)
        if colon < 0:
            out.append(pad + refs(header))
            out.extend(description)
            continue
        head, rest = header[:colon].strip(), refs(header[colon + 1 :].strip())
        if kind in ("Returns", "Yields", "Raises"):
            out.append(f"{pad}{annotation(head)}: {rest}".rstrip())
            out.extend(description)
            continue
        head, default = parameter_header(head, has_default)
        lines = [f"{pad}{head}: {rest}".rstrip(), *description]
        if default is not None:
            lines[-1] = f"{lines[-1].rstrip()} Defaults to {default}."
        out.extend(lines)
    return out


def transform(text: str, path: str, has_default: set[str], resolve, warn: bool = True) -> str:
    """The docstring `text` of the object at `path`, rewritten for griffe's Google parser (see the module doc).
    `has_default`: the parameters whose default the signature gives; `resolve`, `warn`: as for `convert_refs`."""

    def refs(line: str) -> str:
        return convert_refs(line, path, resolve, warn)

    lines, out, index, in_fence = text.split("\n"), [], 0, False
    while index < len(lines):
        line = lines[index]
        index += 1
        if line.strip().startswith("```"):
            in_fence = not in_fence
        match = None if in_fence else _SECTION.match(line)
        if match is None:
            out.append(line if in_fence or line.strip().startswith("```") else refs(line))
            continue
        indent, block = len(match["indent"]), []
        while index < len(lines) and (not lines[index].strip() or _indent(lines[index]) > indent):
            block.append(lines[index])
            index += 1
        trailing = []
        while block and not block[-1].strip():
            trailing.append(block.pop())
        if not block:
            out.append(line)
        else:
            out.extend(_section(match["kind"], indent, block, path, has_default, refs))
        out.extend(trailing)
    return "\n".join(out)


def _signature_defaults(obj: griffe.Object) -> set[str]:
    """The parameters whose default mkdocstrings shows beside them: the signature's, and a dataclass's fields
    (griffe builds a dataclass's `__init__` after this extension runs)."""
    names = set()
    if obj.is_class:
        names |= {member.name for member in obj.members.values() if member.is_attribute and member.value is not None}
    try:
        names |= {parameter.name for parameter in obj.parameters if parameter.default is not None}
    except (AttributeError, griffe.GriffeError):
        pass
    return names


class HFDocstrings(griffe.Extension):
    """Rewrites the docstrings of every object of the package `package` (see the module doc)."""

    def __init__(self, package: str = "trl_es") -> None:
        self.package = package

    def on_package(self, *, pkg: griffe.Module, **kwargs) -> None:
        if pkg.name != self.package:
            return
        public, ours = python_names(pkg)
        resolve = resolver(public, ours)
        # Only what the API pages show can warn: the public objects and their members.
        shown = tuple(pkg[name].final_target.path for name in public if not name.startswith("__"))
        for obj in _walk(pkg):
            if obj.docstring is not None:
                warn = any(obj.path == path or obj.path.startswith(path + ".") for path in shown)
                defaults = _signature_defaults(obj)
                obj.docstring.value = transform(obj.docstring.value, obj.path, defaults, resolve, warn)


def _walk(obj: griffe.Object):
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _walk(member)
