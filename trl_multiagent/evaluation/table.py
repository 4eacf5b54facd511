"""The paper's table from ``eval_results.jsonl`` rows: per cell the peak accuracy and its step, the final accuracy,
the drop from peak, and the residual against SA-RL (MA-RL minus SA-RL, in percentage points).

SA-RL is the single-agent-trained adapter evaluated in the cell's own workflow (``transfer`` rows, "SA-RL in the
same structure"); without those rows, the single-agent run itself (``SingleAgent``, ``trained``).
"""

from __future__ import annotations

from typing import Any

# A cell: one accuracy-vs-step curve.
CELL_FIELDS = ("model", "dataset", "workflow", "policy_sharing", "mode", "trained_workflow", "k", "role_policies")
_MODE_ORDER = {"base": 0, "trained": 1, "transfer": 2, "generator_alone": 3}


def accuracy_curves(rows: list[dict[str, Any]]) -> dict[tuple, list[tuple[int, float]]]:
    """Cell -> ``[(step, accuracy), ...]`` by step; a step evaluated twice keeps its last row."""
    curves: dict[tuple, dict[int, float]] = {}
    for row in rows:
        curves.setdefault(tuple(row.get(name) for name in CELL_FIELDS), {})[row["step"]] = row["accuracy"]
    return {cell: sorted(points.items()) for cell, points in curves.items()}


def paper_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per cell; accuracies are fractions, ``*_pp`` fields percentage points."""
    table = []
    for cell, points in accuracy_curves(rows).items():
        peak_step, peak = max(points, key=lambda point: (point[1], -point[0]))  # the earliest step reaching the peak
        final_step, final = points[-1]
        entry = dict(zip(CELL_FIELDS, cell))
        entry.update(peak=peak, peak_step=peak_step, final=final, final_step=final_step, drop_pp=100 * (peak - final))
        table.append(entry)
    for entry in table:
        entry["residual_pp"], entry["residual_vs"], entry["vs_base_pp"] = None, None, None
        if entry["mode"] != "trained":
            continue
        base = _best(table, entry, mode="base", workflow=entry["workflow"])
        if base is not None:
            entry["vs_base_pp"] = 100 * (entry["peak"] - base["peak"])
        if entry["workflow"] == "SingleAgent":
            continue
        references = (
            ("transfer", {"mode": "transfer", "workflow": entry["workflow"]}),
            ("single_agent", {"mode": "trained", "workflow": "SingleAgent", "role_policies": None}),
        )
        for reference, where in references:
            sa_rl = _best(table, entry, **where)
            if sa_rl is not None:
                entry["residual_pp"], entry["residual_vs"] = 100 * (entry["peak"] - sa_rl["peak"]), reference
                break
    return sorted(
        table,
        key=lambda e: (
            e["model"],
            e["dataset"],
            _MODE_ORDER.get(e["mode"], 9),
            e["workflow"],
            str(e["policy_sharing"]),
        ),
    )


def _best(table: list[dict[str, Any]], entry: dict[str, Any], **match: Any) -> dict[str, Any] | None:
    """The highest-peak cell of the same model, dataset and k matching ``match``."""
    same = dict(model=entry["model"], dataset=entry["dataset"], k=entry["k"], **match)
    found = [other for other in table if all(other[name] == value for name, value in same.items())]
    return max(found, key=lambda other: other["peak"], default=None)


def format_table(table: list[dict[str, Any]]) -> str:
    """The table as markdown, accuracies in percent."""
    columns = ["model", "dataset", "workflow", "sharing", "mode", "peak % (step)", "final % (step)", "drop pp"]
    columns += ["vs SA-RL pp", "vs base pp"]
    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    for e in table:
        lines.append(
            f"| {e['model']} | {e['dataset']} | {e['workflow']} | {e['policy_sharing'] or '-'} | {_mode(e)} "
            f"| {100 * e['peak']:.1f} ({e['peak_step']}) | {100 * e['final']:.1f} ({e['final_step']}) "
            f"| {e['drop_pp']:.1f} | {_points(e['residual_pp'])} | {_points(e['vs_base_pp'])} |"
        )
    return "\n".join(lines) + "\n"


def _mode(entry: dict[str, Any]) -> str:
    return f"{entry['mode']} ({entry['role_policies']})" if entry.get("role_policies") else entry["mode"]


def _points(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f}"
