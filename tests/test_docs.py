"""The documentation build's own checks (docs/hooks/), on small inputs and on the real pages.

The full `mkdocs build --strict` runs in `.ci/run` (`make docs`), not here: these tests only read files.
"""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HOOKS = ROOT / "docs" / "hooks"
sys.path.insert(0, str(HOOKS))

import checks  # noqa: E402  (docs/hooks/checks.py)


def pages() -> dict[str, str]:
    source = ROOT / "docs" / "source"
    return {str(path.relative_to(source)): path.read_text() for path in source.rglob("*.md")}


def test_a_public_name_without_an_api_entry_is_reported():
    documented = {"api/es_trainer.md": "# API\n\n::: trl_es.ESTrainer\n    options:\n      members: [train]\n"}
    assert checks.missing_api_entries(documented, ["ESTrainer", "ESConfig"]) == ["ESConfig"]


def test_every_public_name_has_an_api_entry():
    public = checks.public_names(ROOT / "trl_es" / "__init__.py")
    assert "ESTrainer" in public and "__version__" not in public
    assert checks.missing_api_entries(pages(), public) == []


def test_a_test_the_docs_name_must_be_defined_somewhere_under_tests(tmp_path):
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "test_noise.py").write_text("def test_noise_is_a_pure_function_of_the_seed():\n    pass\n")
    page = "Checked by `test_noise_is_a_pure_function_of_the_seed` and `test_that_was_renamed`.\n"
    assert checks.missing_tests({"core.md": page}, tmp_path) == {"core.md": ["test_that_was_renamed"]}


def test_flags_files_metrics_and_code_blocks_are_not_test_names():
    page = (
        "`--test_split_size`, `tests/test_cli.py`, `test_docs.py`, the metric `test_loss`,\n"
        "```python\ndef test_inside_a_code_block():\n```\n"
    )
    assert checks.test_references(page) == set()
    assert checks.test_path_references(page) == {"tests/test_cli.py"}


def test_every_test_the_docs_name_exists():
    assert checks.missing_tests(pages(), ROOT / "tests") == {}


def test_no_page_cites_a_test_by_its_file():
    cited = {page: checks.test_path_references(markdown) for page, markdown in pages().items()}
    assert {page: paths for page, paths in cited.items() if paths} == {}


def test_hugging_face_parameter_entries_and_trl_sections_are_read_as_google_style():
    pytest.importorskip("griffe")
    from hf_docstrings import transform

    docstring = (
        "Configuration.\n\n"
        "Parameters:\n"
        "    > Evolution Strategies\n\n"
        "    population_size (`int`, *optional*, defaults to `30`):\n"
        "        Members per step.\n\n"
        "    > Fields whose defaults differ from [`~trl.GRPOConfig`]\n\n"
        "    replay_min_age, replay_max_age (`int`, *optional*, default `20`, `100`):\n"
        "        The age window. See [`ESConfig`].\n"
    )
    resolved = transform(docstring, "trl_es.X", {"population_size"}, lambda name: f"trl_es.{name}")
    assert resolved.splitlines() == [
        "Configuration.",
        "",
        "Parameters: Evolution Strategies",
        "    population_size (int):",
        "        Members per step.",
        "",
        "Parameters: Fields whose defaults differ from GRPOConfig",
        "    replay_min_age, replay_max_age (int):",
        "        The age window. See [`ESConfig`][trl_es.ESConfig]. Defaults to `20`, `100`.",
    ]
