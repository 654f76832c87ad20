"""What `make docs` checks beyond mkdocs' own strict mode (used by `build.py`, tested by `tests/test_docs.py`).

- every name of `trl_es.__all__` has an API entry (`::: trl_es.<name>`) on some page;
- every test the pages cite by name (`test_<behaviour>`) is a `def test_<behaviour>(` somewhere under `tests/`;
- no page cites a test file by its path: tests move between folders, their names stay.

Pure functions over text and files, importable without mkdocs.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

API_ENTRY = re.compile(r"^:::\s+trl_es\.(?P<name>\w+)\s*$", re.MULTILINE)
TEST_NAME = re.compile(r"(?<![\w/.-])(?P<name>test_\w+)\b(?!\.py|/)")  # not `--test_x` flags, paths, files
TEST_PATH = re.compile(r"\btests/[\w/]*test_\w+\.py")
TEST_DEF = re.compile(r"^\s*(?:async\s+)?def\s+(?P<name>test_\w+)\s*\(", re.MULTILINE)

# Words the pages use that start with `test_` but name no test.
NOT_TESTS = frozenset({"test_loss"})  # the metric `Trainer.predict` reports


def public_names(init_file: Path) -> list[str]:
    """`__all__` of the package whose `__init__.py` is `init_file`, read without importing it; dunders left out."""
    for node in ast.parse(Path(init_file).read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return [name for name in ast.literal_eval(node.value) if not name.startswith("__")]
    raise ValueError(f"{init_file} defines no __all__")


def api_entries(markdown: str) -> set[str]:
    """The `trl_es.<name>` of every `::: trl_es.<name>` line of a page."""
    return {match["name"] for match in API_ENTRY.finditer(markdown)}


def missing_api_entries(pages: Mapping[str, str], public: Iterable[str]) -> list[str]:
    """The public names that no page (path -> markdown) documents with a `::: trl_es.<name>` entry."""
    documented = set().union(*(api_entries(markdown) for markdown in pages.values()))
    return sorted(set(public) - documented)


def _without_code_blocks(markdown: str) -> str:
    return re.sub(r"^```.*?^```", "", markdown, flags=re.MULTILINE | re.DOTALL)


def test_references(markdown: str) -> set[str]:
    """The test functions a page names (`test_<behaviour>`), outside fenced code; file names (`test_x.py`) excluded."""
    return {m["name"] for m in TEST_NAME.finditer(_without_code_blocks(markdown))} - NOT_TESTS


def test_path_references(markdown: str) -> set[str]:
    """Test files a page cites by path (`tests/test_x.py`), which it should not: cite the test function."""
    return set(TEST_PATH.findall(markdown))


def defined_tests(tests_dir: Path) -> set[str]:
    """Every `def test_<name>(` in a Python file anywhere under `tests_dir`."""
    names: set[str] = set()
    for path in Path(tests_dir).rglob("*.py"):
        names.update(match["name"] for match in TEST_DEF.finditer(path.read_text(errors="replace")))
    return names


def missing_tests(pages: Mapping[str, str], tests_dir: Path) -> dict[str, list[str]]:
    """Page -> the tests it names that no file under `tests_dir` defines (pages with none left out)."""
    defined = defined_tests(tests_dir)
    missing = {page: sorted(test_references(markdown) - defined) for page, markdown in pages.items()}
    return {page: names for page, names in missing.items() if names}
