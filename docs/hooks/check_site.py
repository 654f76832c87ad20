"""`make docs-check`: the built site, rendered by real headless Chromium.

Serves `site/` on 127.0.0.1, takes a screenshot of the index page and of the ESTrainer API page into
`docs/screenshots/`, and checks what Chromium rendered: each page's title, the API page's ESTrainer signature (from
`--dump-dom`), the theme's header colour in the screenshot (so the stylesheets loaded), and that no page asks for
anything off this machine (fonts, CDN scripts). Exits non-zero, saying what failed.

    python docs/hooks/check_site.py [--site site] [--screenshots docs/screenshots] [--chromium /usr/bin/chromium]
"""

from __future__ import annotations

import argparse
import functools
import html
import http.server
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--virtual-time-budget=5000",
]

# page -> (screenshot, title it must have, texts its rendered DOM must show, tags stripped and spaces collapsed)
PAGES = {
    "index.html": ("index.png", "trl-es", ["ESTrainer", "GRPOTrainer"]),
    "api/es_trainer.html": (
        "api_es_trainer.png",
        "ESTrainer - trl-es",
        ["trl_es.ESTrainer", "ESTrainer(model, reward_funcs", "peft_config", "Parameters:"],
    ),
}
HEADER_RGB = (0x40, 0x51, 0xB5)  # material's indigo primary: the header is drawn only if the theme CSS loaded
REMOTE = re.compile(r"""(?:src|href)=["'](?:https?:)?//(?!127\.0\.0\.1)[^"']+\.(?:js|css|woff2?)\b""")


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Serves site/ quietly, remembering every request that failed (a missing stylesheet, script or image)."""

    failed: list[str] = []

    def log_message(self, format, *args) -> None:
        pass

    def log_request(self, code="-", size="-") -> None:
        if str(code).isdigit() and int(code) >= 400:
            self.failed.append(f"{self.path}: HTTP {code}")


def serve(site: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    handler = functools.partial(_Handler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def chromium(binary: str, *args: str) -> str:
    with tempfile.TemporaryDirectory(prefix="trl-es-docs-chromium-") as profile:
        result = subprocess.run(
            [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
            capture_output=True,
            text=True,
            timeout=120,
        )
    if result.returncode != 0:
        raise RuntimeError(f"chromium {' '.join(args)} exited {result.returncode}:\n{result.stderr[-2000:]}")
    return result.stdout


def header_colour(png: Path) -> tuple[int, int, int]:
    from PIL import Image

    with Image.open(png) as image:
        return image.convert("RGB").getpixel((image.width // 2, 5))


def close(colour: tuple[int, int, int], expected: tuple[int, int, int], tolerance: int = 24) -> bool:
    return all(abs(a - b) <= tolerance for a, b in zip(colour, expected, strict=True))


def check(site: Path, screenshots: Path, binary: str) -> list[str]:
    failures = []
    for page_file in sorted(site.rglob("*.html")):
        for remote in REMOTE.findall(page_file.read_text(errors="replace")):
            failures.append(f"{page_file.relative_to(site)} loads {remote} from off this machine")
    screenshots.mkdir(parents=True, exist_ok=True)
    server, base = serve(site)
    try:
        for page, (png, title, texts) in PAGES.items():
            url = f"{base}/{page}"
            dom = chromium(binary, "--dump-dom", url)
            found = re.search(r"<title>(.*?)</title>", dom, re.DOTALL)
            shown_title = found.group(1).strip() if found else None
            if shown_title != title:
                failures.append(f"{page}: title {shown_title!r}, expected {title!r}")
            shown = " ".join(html.unescape(re.sub(r"<[^>]+>", "", dom)).split()).replace("( ", "(")
            failures += [f"{page}: the rendered page lacks {text!r}" for text in texts if text not in shown]
            chromium(binary, f"--screenshot={screenshots / png}", "--window-size=1280,1600", url)
            colour = header_colour(screenshots / png)
            if not close(colour, HEADER_RGB):
                failures.append(f"{page}: header colour {colour} in {png}, not the theme's {HEADER_RGB}: CSS missing?")
            print(f"{page}: title {shown_title!r}, {len(dom):,} characters of DOM, screenshot {screenshots / png}")
    finally:
        server.shutdown()
    failures += [f"the browser asked for {request}" for request in _Handler.failed]
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--site", type=Path, default=Path("site"))
    parser.add_argument("--screenshots", type=Path, default=Path("docs/screenshots"))
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    args = parser.parse_args(argv)
    if not (args.site / "index.html").is_file():
        parser.error(f"{args.site}/index.html is missing: run `make docs` first")
    if not Path(args.chromium).is_file():
        parser.error(f"no Chromium at {args.chromium}: `apt-get install -y chromium` (Debian), or pass --chromium")
    failures = check(args.site, args.screenshots, args.chromium)
    for failure in failures:
        print(f"FAILED: {failure}", file=sys.stderr)
    print("docs-check: " + ("failed" if failures else f"{len(PAGES)} pages rendered and checked"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
