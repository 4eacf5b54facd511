"""Build the docs site and look at it in headless Chromium: a screenshot and the rendered DOM of a few pages.

    python scripts/docs_screenshots.py                    # writes docs/images/screenshots/<page>.png
    python scripts/docs_screenshots.py --out /tmp/shots   # elsewhere

Needs `mkdocs` (`pip install -e ".[docs]"`) and Chromium (Debian: `apt-get install chromium`). The same functions
back `tests/package/test_docs_site.py`, which checks that the pages render with their navigation and code blocks.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCREENSHOTS = ROOT / "docs" / "images" / "screenshots"
# page name -> the built file: the first page, the configuration page and one API page
PAGES = {
    "index": "index.html",
    "configuration": "configuration/index.html",
    "api-trainer": "api/trainer/index.html",
}
WINDOW = (1440, 900)  # wide enough for the navigation sidebar (the theme folds it below 1220 px)
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    return next((path for name in CHROMIUM_NAMES if (path := shutil.which(name))), None)


def find_mkdocs() -> str | None:
    beside_python = Path(sys.executable).parent / "mkdocs"
    return str(beside_python) if beside_python.is_file() else shutil.which("mkdocs")


def build_site(site_dir: Path, mkdocs: str) -> Path:
    """`mkdocs build --strict` of this repository into `site_dir`; raises with mkdocs' output when it fails."""
    result = subprocess.run(
        [mkdocs, "build", "--strict", "--site-dir", str(site_dir)], cwd=ROOT, capture_output=True, text=True
    )
    if result.returncode != 0:
        raise RuntimeError(f"mkdocs build --strict failed:\n{result.stdout}\n{result.stderr}")
    return site_dir


def _chromium(chromium: str, *args: str, timeout: float) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as profile:  # a fresh profile: no state shared between runs
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run"]
        size = f"--window-size={WINDOW[0]},{WINDOW[1]}"
        command = [chromium, *flags, f"--user-data-dir={profile}", size, "--virtual-time-budget=5000", *args]
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {result.returncode}:\n{result.stderr[-2000:]}")
    return result


def rendered_dom(chromium: str, page: Path, timeout: float = 120) -> str:
    """The page's DOM after Chromium loaded it and ran its scripts."""
    return _chromium(chromium, "--dump-dom", page.as_uri(), timeout=timeout).stdout


def screenshot(chromium: str, page: Path, png: Path, timeout: float = 120) -> Path:
    png.parent.mkdir(parents=True, exist_ok=True)
    _chromium(chromium, f"--screenshot={png}", page.as_uri(), timeout=timeout)
    if not png.is_file():
        raise RuntimeError(f"Chromium wrote no screenshot of {page} to {png}")
    return png


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=SCREENSHOTS, help="Folder for <page>.png (default: %(default)s).")
    args = parser.parse_args()
    chromium, mkdocs = find_chromium(), find_mkdocs()
    if chromium is None:
        sys.exit(f"No Chromium on PATH (looked for {', '.join(CHROMIUM_NAMES)}); Debian: apt-get install chromium")
    if mkdocs is None:
        sys.exit('No mkdocs: pip install -e ".[docs]"')
    with tempfile.TemporaryDirectory() as site:
        build_site(Path(site), mkdocs)
        for name, path in PAGES.items():
            png = screenshot(chromium, Path(site) / path, args.out / f"{name}.png")
            print(f"{png} ({png.stat().st_size // 1024} KB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
