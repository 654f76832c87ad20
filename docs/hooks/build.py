"""mkdocs hooks of the trl-es documentation (mkdocs.yml `hooks:`).

- The lab reports are pages of the site: `docs/lab.md`, `docs/rubric_lab.md` and `docs/rubric_lab_methods.md`
  (written by `python -m experiments.coverage_lab --report` / `experiments.rubric_lab --report [--output_dir
  docs/rubric_lab_methods]`, which `make docs` runs first) become pages of the same names, with their folders'
  plots and results.json, read at build time and never copied into the repository.
- `<!-- cli-reference -->` on a page is replaced by the reference generated from the `trl-es` parsers.
- Hugging Face doc-builder references on the pages ([`~trl.GRPOTrainer`], [`ESTrainer`]) become links (`refs.py`).
- Checks that fail `mkdocs build --strict` (they log warnings): every name of `trl_es.__all__` has an API entry, every
  test a page names exists under tests/, and no page cites a test by its file path (`checks.py`).
"""

from __future__ import annotations

import logging
import re
import sys
from pathlib import Path

from mkdocs.structure.files import File

sys.path.insert(0, str(Path(__file__).parent))
import checks  # noqa: E402
import cli_reference  # noqa: E402
from refs import convert_refs, resolver  # noqa: E402

log = logging.getLogger("mkdocs.plugins.trl_es_docs")

ROOT = Path(__file__).resolve().parents[2]
LAB_REPORTS = {
    name: ROOT / "docs" / name
    for name in ("lab.md", "lab_seconds.md", "ablation.md", "rubric_lab.md", "rubric_lab_methods.md", "tools_demo.md")
}
CLI_MARKER = "<!-- cli-reference -->"
FENCE = re.compile(r"^(```|~~~)")

_pages: dict[str, str] = {}


def on_pre_build(config, **kwargs) -> None:
    _pages.clear()


def on_files(files, config, **kwargs):
    for uri, report in LAB_REPORTS.items():
        if not report.is_file():
            log.warning(f"{report} is missing: run `make docs`, which writes it from its results.json")
            continue
        files.append(File.generated(config, uri, content=report.read_text()))
        folder = report.with_suffix("")
        for path in sorted(folder.glob("*")):
            if path.suffix in (".png", ".svg", ".json"):
                files.append(File.generated(config, f"{folder.name}/{path.name}", abs_src_path=str(path)))
    return files


DOUBLE_BACKTICKS = re.compile(r"(``.+?``)")


def _outside_code(markdown: str, transform) -> str:
    """`markdown` with `transform` applied outside fenced code blocks and ``double-backtick`` spans (which show
    the reference syntax itself)."""
    out, fence = [], None
    for line in markdown.split("\n"):
        match = FENCE.match(line.lstrip())
        if fence is None and match:
            fence = match.group(1)
        elif fence is not None and line.lstrip().startswith(fence):
            fence = None
        elif fence is None:
            line = "".join(
                part if DOUBLE_BACKTICKS.fullmatch(part) else transform(part) for part in DOUBLE_BACKTICKS.split(line)
            )
        out.append(line)
    return "\n".join(out)


def on_page_markdown(markdown: str, page, config, files, **kwargs) -> str:
    uri = page.file.src_uri
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_reference.render())
    _pages[uri] = markdown
    if not page.file.generated:  # pages of docs/source; the lab reports are the labs' own
        for path in sorted(checks.test_path_references(markdown)):
            log.warning(f"{uri}: cites the test file {path}; cite the test by its function name (tests move)")
    resolve = resolver(set(checks.public_names(ROOT / "trl_es" / "__init__.py")))
    return _outside_code(markdown, lambda line: convert_refs(line, uri, resolve))


def on_post_build(config, **kwargs) -> None:
    public = checks.public_names(ROOT / "trl_es" / "__init__.py")
    for name in checks.missing_api_entries(_pages, public):
        log.warning(f"trl_es.{name} is in trl_es.__all__ but no page has `::: trl_es.{name}`; add it under api/")
    for uri, names in checks.missing_tests(_pages, ROOT / "tests").items():
        for name in names:
            log.warning(f"{uri}: names the test {name}, but no `def {name}(` exists under tests/")
