"""The paper's table from ``eval_results.jsonl`` rows: per cell the peak accuracy and its step, the final accuracy,
the drop from peak, and the residual against SA-RL (MA-RL minus SA-RL, in percentage points).

SA-RL is the single-agent-trained adapter evaluated in the cell's own workflow (``transfer`` rows, "SA-RL in the
same structure"); without those rows, the single-agent run itself (``SingleAgent``, ``trained``).

``family_table``: one task family's final results over seeds (the paper's Table 1 layout), each trained workflow's
residual against SA-RL alone and against SA-RL in the same workflow with a paired bootstrap interval over problems.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

# A cell: one accuracy-vs-step curve.
CELL_FIELDS = ("model", "dataset", "workflow", "policy_sharing", "mode", "trained_workflow", "k", "role_policies")
_MODE_ORDER = {"base": 0, "trained": 1, "transfer": 2, "generator_alone": 3}


def accuracy_curves(rows: list[dict[str, Any]]) -> dict[tuple, list[tuple[int, float]]]:
    """Cell -> ``[(step, accuracy), ...]`` by step; a step evaluated twice keeps its last row. A cell is its
    ``CELL_FIELDS`` values, and for a best-of-n evaluation also ``(best_of, select)`` after them (a judged one:
    ``(best_of, "judge", judge run)``)."""
    curves: dict[tuple, dict[int, float]] = {}
    for row in rows:
        curves.setdefault(cell_of(row), {})[row["step"]] = row["accuracy"]
    return {cell: sorted(points.items()) for cell, points in curves.items()}


def cell_of(row: dict[str, Any]) -> tuple:
    cell = tuple(row.get(name) for name in CELL_FIELDS)
    if not row.get("best_of"):
        return cell
    judge = (row["judge_of"]["run"],) if row.get("judge_of") else ()
    return (*cell, (row["best_of"], row["select"], *judge))


def paper_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per cell; accuracies are fractions, ``*_pp`` fields percentage points."""
    table = []
    for cell, points in accuracy_curves(rows).items():
        peak_step, peak = max(points, key=lambda point: (point[1], -point[0]))  # the earliest step reaching the peak
        final_step, final = points[-1]
        entry = dict(zip(CELL_FIELDS, cell))
        if len(cell) > len(CELL_FIELDS):
            entry["best_of"], entry["select"], *judge = cell[-1]
            entry.update({"judge": judge[0]} if judge else {})
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
            ("single_agent", {"mode": "trained", "workflow": "SingleAgent", "role_policies": None, "best_of": None}),
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
    found = [other for other in table if all(other.get(name) == value for name, value in same.items())]
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
    if entry.get("best_of"):
        judge = f" by {entry['judge']}" if entry.get("judge") else ""
        return f"{entry['mode']} (best of {entry['best_of']}, {entry['select']}{judge})"
    return f"{entry['mode']} ({entry['role_policies']})" if entry.get("role_policies") else entry["mode"]


def _points(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f}"


# The per-family table: the paper's Table 1 layout, over seeds, with paired bootstrap intervals of the residual.
SINGLE_AGENT = "SingleAgent"
_SHARING_ORDER = {"shared": 0, "isolated": 1}


def family_table(
    rows: list[dict[str, Any]], *, bootstrap: int = 1000, confidence: float = 0.95, seed: int = 0
) -> dict[str, Any]:
    """One task family's rows (every seed's runs and controls) as the paper's Table 1: per line (each trained
    workflow x sharing, SA-RL, SA-RL in each workflow, the base model in each workflow) and per sampling setting
    (greedy, or pass@1 over k samples), the success of each run's newest evaluated checkpoint as the mean and sample
    standard deviation over seeds (a row's ``seed``; the grid evaluates each seed's runs with that seed), and for a
    trained workflow its residual against SA-RL alone (``vs_single_agent``) and against SA-RL in the same workflow
    (``vs_transfer``): the difference in success on the same problems, with a paired percentile bootstrap interval
    over problems. Seeds are pooled per problem: each problem's success is averaged over the seeds both sides have,
    then problems are resampled (the interval is over problems, at these seeds). Accuracies are fractions.

    The cost-matched baseline: SA-RL's best-of-n evaluations (rows with ``best_of``) are lines of their own, one per
    n and selection ("SA-RL best-of-3 (majority)"), with their residual against SA-RL alone; each trained workflow
    then also has ``vs_best_of``, its residual against the best-of-n evaluation whose n is its own measured calls
    per episode (its row's ``mean_calls``, rounded up), matched per seed (``n``: those n per seed). A table without
    best-of rows has no ``vs_best_of``. Judged best-of-n rows (``select`` "judge", ``judge_of`` naming the Eval-Opt
    run whose evaluator chose) are lines per n and judge ("SA-RL best-of-5 (judge: EvalOpt isolated)"), and the
    workflow line of that judge gets ``vs_judged_best_of`` likewise.

    Rows of other modes (``generator_alone``) and with ``role_policies`` (attribution subsets) are left out.
    """
    from .bootstrap import paired_difference
    from .results import problem_success

    final: dict[tuple, dict[tuple, dict[int, dict[str, Any]]]] = {}
    for row in rows:
        line = _family_line(row)
        if line is None:
            continue
        by_seed = final.setdefault(line, {}).setdefault(_setting(row), {})
        kept = by_seed.get(row.get("seed"))
        if kept is None or row["step"] >= kept["step"]:  # the newest checkpoint; of a step evaluated twice, the last
            by_seed[row.get("seed")] = row
    settings = sorted(
        {s for by_setting in final.values() for s in by_setting}, key=lambda s: (bool(s[1]), s[0] or 0, str(s))
    )
    labels = _setting_labels(settings)
    notes: list[str] = []
    outcomes: dict[int, list[float] | None] = {}

    def per_problem(row: dict[str, Any]) -> list[float] | None:
        if id(row) not in outcomes:
            try:
                outcomes[id(row)] = problem_success(row)
            except (KeyError, FileNotFoundError) as missing:
                outcomes[id(row)] = None
                notes.append(
                    f"no per-problem outcomes for {row.get('run')} ({row['mode']} {row['workflow']}, step "
                    f"{row['step']}, seed {row.get('seed')}): {missing!r}; evaluate it again for its interval."
                )
        return outcomes[id(row)]

    def residual(ours: dict[int, dict], theirs: dict[int, dict] | None) -> dict[str, Any] | None:
        seeds = sorted(set(ours) & set(theirs or {}), key=_seed_order)
        if not seeds:
            return None
        sides = [[per_problem(side[s]) for s in seeds] for side in (ours, theirs)]
        if any(outcome is None for side in sides for outcome in side):
            return {"value": None, "low": None, "high": None, "seeds": seeds}
        pooled = [np.mean(side, axis=0) for side in sides]  # [problems]: each problem's success over the seeds
        difference = paired_difference(*pooled, bootstrap=bootstrap, confidence=confidence, seed=seed)
        return {**difference, "seeds": seeds}

    best_of_lines = [line for line in final if line[0] == "best_of"]
    judged = any(line[2][1] == "judge" for line in best_of_lines)

    def cost_matched(by_seed: dict[int, dict], setting: tuple, chosen: tuple) -> dict[str, Any] | None:
        """Per seed, SA-RL's best-of-n evaluation with n = this seed's measured calls per episode, rounded up, and
        ``chosen`` its selection (and judge)."""
        matched = {}
        for s, row in by_seed.items():
            if "mean_calls" not in row:
                continue
            n = math.ceil(row["mean_calls"] - 1e-9)
            for line in best_of_lines:
                if line[2] == (n, *chosen) and s in final[line].get(setting, {}):
                    matched[s] = final[line][setting][s]
                    break
        result = residual(by_seed, matched)
        return None if result is None else {**result, "n": [matched[s]["best_of"] for s in result["seeds"]]}

    lines = []
    for line in sorted(final, key=_line_order):
        mode, workflow, sharing = line
        results = {}
        for setting, by_seed in final[line].items():
            seeds = sorted(by_seed, key=_seed_order)
            accuracies = [by_seed[s]["accuracy"] for s in seeds]
            entry = {
                "mean": float(np.mean(accuracies)),
                "std": float(np.std(accuracies, ddof=1)) if len(accuracies) > 1 else None,
                "seeds": seeds,
                "steps": sorted({row["step"] for row in by_seed.values()}),
                "vs_single_agent": None,
                "vs_transfer": None,
            }
            single_agent = final.get(("trained", SINGLE_AGENT, None), {})
            if mode == "trained" and workflow != SINGLE_AGENT:
                transfer = final.get(("transfer", workflow, None), {})
                entry["vs_single_agent"] = residual(by_seed, single_agent.get(setting))
                entry["vs_transfer"] = residual(by_seed, transfer.get(setting))
                if best_of_lines:
                    entry["vs_best_of"] = cost_matched(by_seed, setting, ("majority",))
                if judged:  # the judged best-of-n whose judge is this line's own evaluator
                    entry["vs_judged_best_of"] = cost_matched(by_seed, setting, ("judge", workflow, sharing))
            elif mode == "best_of":
                entry["vs_single_agent"] = residual(by_seed, single_agent.get(setting))
            results[labels[setting]] = entry
        if mode == "best_of":  # workflow: SingleAgent; sharing: (n, selection)
            described = {"mode": "trained", "workflow": workflow, "policy_sharing": None}
            described.update(best_of=sharing[0], select=sharing[1])
            described.update(dict(zip(("judge_workflow", "judge_policy_sharing"), sharing[2:])))
        else:
            described = {"mode": mode, "workflow": workflow, "policy_sharing": sharing}
        lines.append({"label": _line_label(line), **described, "results": results})
    return {
        "settings": [dict(zip(_SETTING_FIELDS, s), label=labels[s]) for s in settings],
        "lines": lines,
        "confidence": confidence,
        "bootstrap": bootstrap,
        "notes": notes,
    }


def _seed_order(seed: int | None) -> tuple:
    return (seed is not None, seed or 0)  # rows recorded without a seed first


_SETTING_FIELDS = ("k", "temperature", "top_p", "max_completion_length", "num_problems", "dataset", "chat_rendering")


def _setting(row: dict[str, Any]) -> tuple:
    """How a row sampled and on what: rows of one setting share their problems."""
    return tuple(row.get(name) for name in _SETTING_FIELDS)


def _setting_labels(settings: list[tuple]) -> dict[tuple, str]:
    """``greedy`` or ``pass@1 k=4 T=0.7``; settings that would read alike also name their problems and length."""
    short = {s: _sampling_label(*s[:2]) for s in settings}
    counts = {label: list(short.values()).count(label) for label in short.values()}
    return {
        s: label if counts[label] == 1 else f"{label}, {s[4]} problems, {s[3]} tokens" for s, label in short.items()
    }


def _sampling_label(k: int | None, temperature: float | None) -> str:
    if temperature is None:
        return "accuracy"  # a row that does not record how it sampled
    return "greedy" if temperature == 0 else f"pass@1 k={k} T={temperature:g}"


def _family_line(row: dict[str, Any]) -> tuple | None:
    if row.get("role_policies"):
        return None
    if row.get("best_of"):
        if row["mode"] == "trained" and row["workflow"] == SINGLE_AGENT:
            return ("best_of", SINGLE_AGENT, (row["best_of"], row["select"], *_judge_of(row)))
        return None
    if row["mode"] == "trained":
        sharing = None if row["workflow"] == SINGLE_AGENT else row.get("policy_sharing")
        return ("trained", row["workflow"], sharing)
    if row["mode"] in ("transfer", "base"):
        return (row["mode"], row["workflow"], None)
    return None


def _judge_of(row: dict[str, Any]) -> tuple:
    """A judged best-of-n row's judge, as the line of the workflow it came from: (workflow, sharing); () else."""
    judge = row.get("judge_of")
    return (judge["workflow"], judge["policy_sharing"]) if judge else ()


def _line_order(line: tuple) -> tuple:
    mode, workflow, sharing = line
    if mode == "trained" and workflow == SINGLE_AGENT:
        return (0, "", 0, "")
    if mode == "best_of":  # after SA-RL, by n
        return (0, "", 1, *sharing)
    if mode == "base":
        return (2, workflow != SINGLE_AGENT, workflow, 0, "")
    return (1, workflow, 2 if mode == "transfer" else _SHARING_ORDER.get(sharing, 1.5), str(sharing))


def _line_label(line: tuple) -> str:
    mode, workflow, sharing = line
    if mode == "best_of":
        judge = f": {' '.join(map(str, sharing[2:]))}" if len(sharing) > 2 else ""
        return f"SA-RL best-of-{sharing[0]} ({sharing[1]}{judge})"
    if mode == "trained":
        return "SA-RL" if workflow == SINGLE_AGENT else workflow
    return f"SA-RL in {workflow}" if mode == "transfer" else f"base model, {workflow}"


def format_family_table(title: str, table: dict[str, Any]) -> str:
    """The family table as markdown: per sampling setting the success in percent (mean ± standard deviation over
    seeds) and the residuals in points with their intervals."""
    labels = [s["label"] for s in table["settings"]]
    all_seeds = sorted(
        {s for line in table["lines"] for r in line["results"].values() for s in r["seeds"]}, key=_seed_order
    )
    pct = round(100 * table["confidence"])
    spread = "mean ± standard deviation over seeds" if len(all_seeds) > 1 else "one seed"
    lines = [
        f"{title}: seed(s) {', '.join(map(str, all_seeds))}; success % of each run's newest evaluated checkpoint "
        f"({spread}); residuals in points, [{pct}% paired bootstrap interval over problems, seeds pooled per problem]",
        "",
    ]
    best_of = any(line["mode"] == "trained" and line.get("best_of") for line in table["lines"])
    judged = any(line.get("select") == "judge" for line in table["lines"])
    matched_columns = {"vs_best_of": "vs SA-RL best-of-n pp"} if best_of else {}
    matched_columns |= {"vs_judged_best_of": "vs SA-RL judged best-of-n pp"} if judged else {}
    columns = ["line", "sharing", "step"]
    for label in labels:
        columns += [f"{label} %", "vs SA-RL pp", "vs SA-RL in workflow pp", *matched_columns.values()]
    lines += ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    for line in table["lines"]:
        steps = sorted({s for r in line["results"].values() for s in r["steps"]})
        cells = [line["label"], line["policy_sharing"] or "-", "/".join(map(str, steps))]
        for label in labels:
            result = line["results"].get(label)
            if result is None:
                cells += ["-"] * (3 + len(matched_columns))
                continue
            value = f"{100 * result['mean']:.1f}"
            if result["std"] is not None:
                value += f" ± {100 * result['std']:.1f}"
            if len(result["seeds"]) < len(all_seeds):
                value += f" (seeds {', '.join(map(str, result['seeds']))})"
            cells += [value, _residual(result["vs_single_agent"]), _residual(result["vs_transfer"])]
            for key in matched_columns:
                matched = result.get(key)
                n = f" (n={'/'.join(map(str, dict.fromkeys(matched['n'])))})" if matched and matched["n"] else ""
                cells.append(_residual(matched) + n)
        lines.append("| " + " | ".join(cells) + " |")
    if best_of:
        lines.append(
            "\n- vs SA-RL best-of-n: against SA-RL sampled n times per episode, the chosen answer graded, n being "
            "the workflow's measured model calls per episode rounded up (n=, per seed)."
        )
    if judged:
        lines.append(
            "- vs SA-RL judged best-of-n: against n SA-RL samples each judged by the workflow's own trained "
            "evaluator (n more calls), the majority among the accepted answers graded."
        )
    lines += [f"\n- {note}" for note in table["notes"]]
    return "\n".join(lines) + "\n"


def _residual(entry: dict[str, Any] | None) -> str:
    if entry is None:
        return "-"
    if entry["value"] is None:
        return "? (no per-problem outcomes)"
    return f"{100 * entry['value']:+.1f} [{100 * entry['low']:+.1f}, {100 * entry['high']:+.1f}]"
