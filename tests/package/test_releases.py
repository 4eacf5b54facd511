"""Releases a user can follow: the installed version is CHANGELOG.md's newest release, changes since then wait under
`## Unreleased`, and deprecations name the next minor release as the one that removes them."""

from __future__ import annotations

import re
from pathlib import Path

from packaging.version import Version

import trl_multiagent
from trl_multiagent.common.deprecation import REMOVED_IN

CHANGELOG = Path(__file__).resolve().parents[2] / "CHANGELOG.md"
RELEASE = re.compile(r"## (?P<version>\d+\.\d+\.\d+(?:\+\w+)?) - (?P<date>\d{4}-\d\d-\d\d)\b.*")


def sections() -> list[tuple[str, str]]:
    """(header, body) of each `## ` section of CHANGELOG.md, in order."""
    parts = re.split(r"^(## .*)$", CHANGELOG.read_text(), flags=re.M)
    return list(zip(parts[1::2], parts[2::2]))


def releases() -> list[re.Match]:
    return [RELEASE.fullmatch(header) for header, _ in sections()[1:]]


def test_unreleased_comes_first_and_every_other_section_is_a_numbered_dated_release():
    headers = [header for header, _ in sections()]
    assert headers[0] == "## Unreleased"
    unnumbered = [header for header, match in zip(headers[1:], releases()) if match is None]
    assert unnumbered == [], "each release section reads `## X.Y.Z - YYYY-MM-DD`"


def test_releases_are_newest_first():
    found = releases()
    versions = [Version(Version(m["version"]).public) for m in found]  # 0.1.0+<commit> counts as 0.1.0
    dates = [m["date"] for m in found]
    assert versions == sorted(versions, reverse=True) and dates == sorted(dates, reverse=True)
    assert len({m["version"] for m in found}) == len(found)


def test_the_installed_version_is_the_newest_release():
    newest = releases()[0]["version"]
    assert "+" not in newest, "a release is a plain version number"
    assert trl_multiagent.__version__ == newest, "bump `__version__` with the CHANGELOG's newest release"


def test_deprecations_name_the_next_minor_release():
    newest = Version(releases()[0]["version"])
    assert Version(REMOVED_IN) == Version(f"{newest.major}.{newest.minor + 1}.0")
    _, body = sections()[1]
    said = set(re.findall(r"removed in (\d+\.\d+\.\d+)", body))
    assert said <= {REMOVED_IN}, f"the newest release's notes name removals in {sorted(said)}, not {REMOVED_IN}"
