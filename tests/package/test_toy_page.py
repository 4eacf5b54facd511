"""The toy page's figure and table come from the records: every number of docs/data/toy_residuals.csv is in the
matching three-seed table of docs/toy-records.md, the page's table is the CSV's, and the script draws the figure."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from harness import load_script

ROOT = Path(__file__).resolve().parents[2]
RECORDS = (ROOT / "docs" / "toy-records.md").read_text()
PAGE = (ROOT / "docs" / "toy.md").read_text()
FIRST_PAGE = (ROOT / "docs" / "index.md").read_text()


script = load_script("scripts/toy_residuals.py")
ROWS = script.read_rows()


def three_seed_tables(family: str) -> list[dict[str, dict[str, str]]]:
    """Each table of the records headed "<family> (...) on <model>: seed(s) 1, 2, 3", as line -> column -> cell (the
    second of two same-named columns, the pass@1 one, keyed with a "pass@1 " prefix)."""
    tables = []
    for block in re.findall(rf"^{family} \(.*?\) on \S+: seed\(s\) 1, 2, 3;.*\n\n((?:\|.*\n)+)", RECORDS, re.M):
        header, _, *lines = [[cell.strip() for cell in line.strip("|\n").split("|")] for line in block.splitlines()]
        first_pass = header.index("pass@1 k=4 T=0.7 %")
        names = [name if i <= first_pass else f"pass@1 {name}" for i, name in enumerate(header)]
        tables.append({f"{line[0]} {line[1]}".strip(" -"): dict(zip(names, line)) for line in lines})
    return tables


def _mean(cell: str) -> float:
    return float(cell.split(" ± ")[0])


def _interval(cell: str) -> tuple[float, float, float]:
    value, low, high = re.fullmatch(r"([+-][\d.]+) \[([+-][\d.]+), ([+-][\d.]+)\]", cell).groups()
    return float(value), float(low), float(high)


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r['family']}-{r['steps']:.0f}-{r['sampling']}")
def test_each_figure_number_is_in_its_records_table(row):
    prefix = "" if row["sampling"] == "greedy" else "pass@1 "
    level = "greedy %" if row["sampling"] == "greedy" else "pass@1 k=4 T=0.7 %"
    matching = []
    for table in three_seed_tables(row["family"]):
        ours = table.get("EvalOpt isolated", {})
        if ours.get("step") != f"{row['steps']:.0f}":
            continue
        matching.append(
            {
                "base_single": _mean(table["base model, SingleAgent"][level]),
                "base_workflow": _mean(table["base model, EvalOpt"][level]),
                "sa_rl": _mean(table["SA-RL"][level]),
                "sa_rl_in_workflow": _mean(table["SA-RL in EvalOpt"][level]),
                "trained_workflow": _mean(ours[level]),
                "residual": _interval(ours[f"{prefix}vs SA-RL in workflow pp"]),
                "vs_sa_rl": _interval(ours[f"{prefix}vs SA-RL pp"]),
            }
        )
    expected = {
        **{name: row[name] for name in ("base_single", "base_workflow", "sa_rl", "sa_rl_in_workflow")},
        "trained_workflow": row["trained_workflow"],
        "residual": (row["residual"], row["residual_low"], row["residual_high"]),
        "vs_sa_rl": (row["vs_sa_rl"], row["vs_sa_rl_low"], row["vs_sa_rl_high"]),
    }
    assert matching, f"no three-seed {row['family']} table at {row['steps']:.0f} steps in docs/toy-records.md"
    assert expected in matching


def test_the_pages_table_is_the_figures_30_step_pass_at_1_data():
    """The toy page's table: a row per quantity, a column per family."""
    lines = [line for line in PAGE.splitlines() if line.startswith("| ")]
    start = next(i for i, line in enumerate(lines) if line.startswith("| at 30 steps, pass@1 %"))
    header, _, *rows = [
        [c.strip().replace("**", "") for c in line.strip("|").split("|")] for line in lines[start : start + 10]
    ]
    table = {row[0]: dict(zip([name.split(" (")[0] for name in header[1:]], row[1:])) for row in rows}
    for row in (r for r in ROWS if r["steps"] == 30 and r["sampling"] == "pass@1"):
        column = {quantity: cells[row["family"]] for quantity, cells in table.items()}
        shape = row["base_workflow"] - row["base_single"]
        residual = f"{row['residual']:+.1f} [{row['residual_low']:+.1f}, {row['residual_high']:+.1f}]"
        vs_sa_rl = f"{row['vs_sa_rl']:+.1f} [{row['vs_sa_rl_low']:+.1f}, {row['vs_sa_rl_high']:+.1f}]"
        assert column == {
            "one pass, untrained": f"{row['base_single']:.1f}",
            "Eval-Opt, untrained": f"{row['base_workflow']:.1f}",
            "shape": f"{shape:+.1f}",
            "SA-RL": f"{row['sa_rl']:.1f}",
            "SA-RL in Eval-Opt": f"{row['sa_rl_in_workflow']:.1f}",
            "trained Eval-Opt": f"{row['trained_workflow']:.1f}",
            "residual [95%]": residual,
            "trained Eval-Opt - SA-RL [95%]": vs_sa_rl,
        }


def test_the_first_pages_table_is_the_figures_30_step_pass_at_1_data():
    for row in (r for r in ROWS if r["steps"] == 30 and r["sampling"] == "pass@1"):
        (line,) = [line for line in FIRST_PAGE.splitlines() if line.startswith(f"| {row['family']} ")]
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        shape = row["base_workflow"] - row["base_single"]
        residual = f"{row['residual']:+.1f} [{row['residual_low']:+.1f}, {row['residual_high']:+.1f}]"
        assert cells[1:] == [f"{shape:+.1f}", f"{row['sa_rl']:.1f}%", f"{row['trained_workflow']:.1f}%", residual]


def test_the_script_draws_the_figure(tmp_path):
    pytest.importorskip("matplotlib")
    png = script.draw(ROWS, tmp_path / "toy_residuals.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
