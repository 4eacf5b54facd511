"""docs/architecture.md's table of private hooks points at the upstream lines each follows: where the installed
release is the one the table names, each `path:line` there is the `def`, `class` or assignment the row names."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from pathlib import Path

import pytest

ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
DISTRIBUTIONS = {"trl": "TRL", "transformers": "transformers", "peft": "PEFT", "accelerate": "accelerate"}
DISTRIBUTIONS["deepspeed"] = "DeepSpeed"


def documented_releases(text: str) -> dict[str, str]:
    """Top-level package -> the release the table was read in, from the sentence above it."""
    found = {}
    for package, spelled in DISTRIBUTIONS.items():
        found[package] = re.search(rf"\b{spelled} (\d+\.\d+\.\d+)", text).group(1)
    return found


def rows(text: str) -> list[tuple[set[str], list[tuple[str, int]]]]:
    """Each table row's upstream names (the last part of each backticked name) and its `path:line` places (a bare
    `:line` is in the row's previous path)."""
    table = text[text.index("| seam (ours) | upstream it follows | at |") :].split("\n\n")[0]
    found = []
    for line in table.splitlines()[2:]:
        _, _, follows, at, _ = line.split("|")
        names = {name.split(".")[-1] for name in re.findall(r"`([\w.]+)`", follows)}
        places, path = [], None
        for place in re.findall(r"`([\w/.]*):(\d+)`", at):
            path = place[0] or path
            places.append((path, int(place[1])))
        found.append((names, places))
    return found


def installed_file(path: str) -> Path | None:
    spec = importlib.util.find_spec(path.split("/")[0])
    return None if spec is None else Path(spec.submodule_search_locations[0]).parent / path


def test_the_table_names_a_place_for_every_row():
    table = rows(ARCHITECTURE.read_text())
    assert len(table) >= 40 and all(names and places for names, places in table)


def test_each_line_is_what_the_row_names_in_the_release_it_names():
    text = ARCHITECTURE.read_text()
    releases = documented_releases(text)
    checked, wrong = 0, []
    for names, places in rows(text):
        for path, number in places:
            package = path.split("/")[0]
            file = installed_file(path)
            if file is None or importlib.metadata.version(package) != releases[package]:
                continue  # another release: the table speaks of the one it names
            source = file.read_text().splitlines()[number - 1]
            checked += 1
            if not any(re.search(rf"\b{re.escape(name)}\b", source) for name in names):
                wrong.append(f"{path}:{number} is {source.strip()!r}, none of {sorted(names)}")
    if checked == 0:
        pytest.skip(f"none of the releases the table was read in is installed: {releases}")
    assert wrong == []
