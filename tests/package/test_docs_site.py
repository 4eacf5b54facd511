"""The docs site as a reader sees it: built with `mkdocs build --strict`, loaded in headless Chromium.

Needs mkdocs (`pip install -e ".[docs]"`) and Chromium (Debian: `apt-get install chromium`); skipped without them,
except where TRL_MA_REQUIRE_BROWSER=1 (CI sets it) turns a missing one into a failure. Slow (a site build and six
browser starts): `python -m pytest -q -m slow tests/package/test_docs_site.py`.
"""

from __future__ import annotations

import importlib.util
import os
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def _screenshots_module():
    spec = importlib.util.spec_from_file_location("docs_screenshots", ROOT / "scripts" / "docs_screenshots.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


shots = _screenshots_module()


def _require(tool: str | None, what: str) -> str:
    if tool is not None:
        return tool
    if os.environ.get("TRL_MA_REQUIRE_BROWSER") == "1":
        pytest.fail(f"TRL_MA_REQUIRE_BROWSER=1 but {what} is missing")
    pytest.skip(f"{what} is missing (set TRL_MA_REQUIRE_BROWSER=1 to fail instead)")


@pytest.fixture(scope="module")
def chromium() -> str:
    return _require(shots.find_chromium(), "Chromium (apt-get install chromium)")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    mkdocs = _require(shots.find_mkdocs(), 'mkdocs (pip install -e ".[docs]")')
    return shots.build_site(tmp_path_factory.mktemp("site"), mkdocs)


VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class _Elements(HTMLParser):
    """Every element as (tag, attributes, its text, nested elements' text included)."""

    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict[str, str], list[str]]] = []
        self._open: list[int] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, {key: value or "" for key, value in attrs}, []))
        if tag not in VOID:
            self._open.append(len(self.tags) - 1)

    def handle_endtag(self, tag):
        for depth in range(len(self._open) - 1, -1, -1):  # close the innermost open `tag` and what it left open
            if self.tags[self._open[depth]][0] == tag:
                del self._open[depth:]
                break

    def handle_data(self, data):
        for index in self._open:
            self.tags[index][2].append(data)

    def having(self, tag: str, css_class: str = "") -> list[dict[str, str]]:
        return [
            attrs
            for name, attrs, _ in self.tags
            if name == tag and (not css_class or css_class in attrs.get("class", "").split())
        ]

    def texts(self, *tags: str) -> list[str]:
        return ["".join(chunks) for name, _, chunks in self.tags if name in tags]


def _render(chromium: str, site: Path, page: str) -> _Elements:
    dom = shots.rendered_dom(chromium, site / page)
    elements = _Elements()
    elements.feed(dom)
    return elements


# page -> whether it holds code blocks (the configuration page is tables of fields: inline code only)
CODE_BLOCKS = {"index": True, "configuration": False, "api-trainer": True}


@pytest.mark.parametrize("name", list(shots.PAGES))
def test_each_checked_page_renders_its_navigation_code_and_scripts(chromium, site, name):
    page = shots.PAGES[name]
    elements = _render(chromium, site, page)
    assert elements.having("nav", "md-nav--primary"), f"{page}: no primary navigation"
    titles = " ".join(text.strip() for text in elements.texts("a", "label"))
    for title in ("Quickstart", "Configuration", "The toy world", "Trainer"):  # the nav of mkdocs.yml
        assert title in titles, f"{page}: the navigation lacks {title!r}"
    assert elements.having("code"), f"{page}: no code"
    # The theme's bundle, once the page is loaded, strips every `data-md-scrollfix` the built HTML carries and gives
    # every code block a copy button. (Its sizing of the sidebars is not checked: it waits for layout, and Chromium's
    # dump missed it in 2 to 4 of 30 renders whatever the virtual-time budget, while the bundle had run.)
    built = (site / page).read_text(encoding="utf-8")
    assert "data-md-scrollfix" in built, f"{page}: the built page has no data-md-scrollfix to check the script by"
    left = [attrs for _, attrs, _ in elements.tags if "data-md-scrollfix" in attrs]
    assert not left, f"{page}: {len(left)} data-md-scrollfix left, so the site's JavaScript did not run"
    if CODE_BLOCKS[name]:
        assert elements.having("div", "highlight"), f"{page}: no highlighted code block"
        copy = [attrs for attrs in elements.having("button") if attrs.get("data-clipboard-target", "")]
        assert copy, f"{page}: no copy button on its code blocks"
    stylesheets = [attrs["href"] for attrs in elements.having("link") if attrs.get("rel") == "stylesheet"]
    local = [href for href in stylesheets if not re.match(r"^[a-z]+:", href)]
    assert local and all((site / page).parent.joinpath(href.split("?")[0]).resolve().is_file() for href in local)


def test_the_api_page_shows_the_trainer_with_its_signature_and_docstring(chromium, site):
    elements = _render(chromium, site, shots.PAGES["api-trainer"])
    assert any("MultiAgentGRPOTrainer" in heading for heading in elements.texts("h2"))
    signatures = ["".join(chunks) for _, attrs, chunks in elements.tags if "doc-signature" in attrs.get("class", "")]
    assert any("MultiAgentGRPOTrainer(" in signature for signature in signatures), "no rendered signature"
    assert any("GRPOTrainer" in text for text in elements.texts("p")), "no docstring text"


def test_the_configuration_page_lists_the_fields_with_their_help(chromium, site):
    elements = _render(chromium, site, shots.PAGES["configuration"])
    headings = elements.texts("h3")
    assert any("policy_sharing" in heading for heading in headings) and len(headings) > 20


def test_a_screenshot_shows_the_themed_page_not_a_blank_one(chromium, site, tmp_path):
    from PIL import Image

    png = shots.screenshot(chromium, site / shots.PAGES["index"], tmp_path / "index.png")
    image = Image.open(png).convert("RGB")
    assert image.size == shots.WINDOW
    red, green, blue = image.getpixel((5, 5))  # the header bar, in the theme's primary colour (indigo)
    assert blue > 150 and blue > red + 60 and blue > green + 60, f"header pixel {(red, green, blue)}: no theme CSS"
    assert len(image.getcolors(maxcolors=1 << 16) or range(1 << 16)) > 50, "an almost uniform screenshot"


@pytest.mark.parametrize(
    ("page", "image"),
    [
        ("monitoring/index.html", "images/training_summary.png"),
        ("evaluation/index.html", "images/grid/"),
    ],
)
def test_the_plots_appear_on_the_pages_that_discuss_them(site, page, image):
    elements = _Elements()
    elements.feed((site / page).read_text())
    sources = [(site / page).parent.joinpath(attrs["src"]).resolve() for attrs in elements.having("img")]
    shown = [src for src in sources if str(src).startswith(str((site / image).resolve()))]
    assert shown, f"{page} shows no {image}"
    assert all(src.is_file() and src.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for src in shown)
