"""A record of docs/toy-records.md quotes what its command prints, where the command is cheap enough to run here.

Record V1's command, ``python scripts/mod_search_feasibility.py``, runs scripted policies without a model; its
policies that take seconds are run again here with the command's defaults and their lines must be the record's, line
for line (the workflow policies, about a minute together, are left out). Every other toy record's command trains or
evaluates the toy model for minutes; those records stay as measured, each with its date and commit.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from harness import load_script

from trl_multiagent.tasks.mod_search import N_CANDIDATES

RECORDS = (Path(__file__).resolve().parents[2] / "docs" / "toy-records.md").read_text()
feasibility = load_script("scripts/mod_search_feasibility.py")
CHEAP = ("one pass (single agent)", "one pass, check and switch (its ceiling)")  # a few seconds each


@pytest.fixture(scope="module")
def build():
    return feasibility.load_build()  # the toy teacher, whose roles are the scripted policies


def v1_table() -> list[str]:
    """The lines of record V1's table, quoted below its command."""
    found = re.search(r"```bash\npython scripts/mod_search_feasibility\.py\n```\n\n((?:\|.*\n)+)", RECORDS)
    assert found, "record V1's table no longer follows its command in docs/toy-records.md"
    return found.group(1).splitlines()


def v1_against_k() -> dict[int, list[str]]:
    """Record V1's table against k at the teacher's judge accuracy, as the record writes it in prose: k -> the
    success % of one pass, check and switch, best of 3 judged and Eval-Opt."""
    prose = " ".join(RECORDS.split("Against k at judge accuracy 0.9", 1)[1].split("\n\n", 1)[0].split())
    return {int(k): cells.split(" / ") for k, cells in re.findall(r"k = (\d+): ([\d. /]+\d);?", prose)}


@pytest.mark.parametrize("label", CHEAP)
def test_record_v1_quotes_the_line_its_command_prints(build, label):
    table = v1_table()
    accuracies = [float(q) for q in re.findall(r"judge accuracy ([\d.]+)", table[0])]
    problems = feasibility.held_out(feasibility.PROBLEMS, N_CANDIDATES)
    printed = feasibility.policy_row(build, label, problems, accuracies, feasibility.SEED)
    quoted = next((line for line in table if line.startswith(f"| {label} |")), None)
    assert printed == quoted, f"record V1 quotes\n  {quoted}\nwhere its command now prints\n  {printed}"


@pytest.mark.parametrize("method", ["one_pass", "check_and_switch"])
def test_record_v1_quotes_its_table_against_k(build, method):
    quoted = v1_against_k()
    assert sorted(quoted) == [3, 4, 5, 6], quoted
    column = feasibility.K_METHODS.index(method)
    for k, cells in quoted.items():
        printed = feasibility.k_cell(build, method, feasibility.held_out(feasibility.PROBLEMS, k), feasibility.SEED)
        assert printed.split(" (")[0] == cells[column], f"k = {k}, {method}: record {cells[column]}, now {printed}"
