"""Draw docs/images/toy_amplification.png, docs/toy.md's amplification figure, from docs/data/toy_amplification.csv.

    python scripts/toy_amplification.py                   # needs matplotlib (pip install -e ".[plots]")
    python scripts/toy_amplification.py --out /tmp/toy_amplification.png
    python scripts/toy_amplification.py --collect outputs/amplification --long outputs/amplification-long

`--collect` rebuilds the CSV from the run folders under the folders it names (each run's `trainer_state.json`,
`multiagent_config.json` and `training_args.bin`, from its newest checkpoint if it stopped before its end), the
`--long` runs' kept apart; the records are in docs/toy-records.md (records M1-M3). The CSV holds one row per (run,
step, role, metric), `part` `sweep` or `long`. Metrics: `update_ratio` and `update_chi_square` (how far the step's
updates moved the role's policy on the step's own tokens, `monitor_update_size`), the loss's own `policy_ratio` and
`chi_square`, `grad_norm` (before clipping, over the step's updates of the role's adapter) and
`grad_norm_per_update`, `entropy`; per run `success` (role empty) and each drift alarm (`alarm/<kind>`, value 1 at
its step).

The figure: per role with several instances (Voting's voters, Orch-Workers' workers) the update size against the
instance count under both update schedules, the mean over seeds with its 95% interval and each seed as a dot, the
gradient norm per update likewise; then the long run's success and update size over its steps, its alarms marked.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path

from trl_multiagent.cli.report import load_training_args
from trl_multiagent.evaluation.instability import read_log_history
from trl_multiagent.evaluation.mechanisms import (
    alarm_steps,
    per_update_grad_norm,
    running_mean,
    seed_interval,
    step_series,
)

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "docs" / "data" / "toy_amplification.csv"
OUT = ROOT / "docs" / "images" / "toy_amplification.png"
COLUMNS = ("part", "workflow", "role", "instances", "schedule", "seed", "steps", "step", "metric", "value")
ROLE_METRICS = ("update_ratio", "update_chi_square", "policy_ratio", "chi_square", "grad_norm", "entropy")
# The role with several instances per episode, and its workflow's parameter counting them.
PARALLEL = {"Voting": ("generator", "n_voters"), "OrchWorkers": ("worker", "n_workers")}
INSTANCE = {"generator": "voter", "worker": "worker"}  # what one instance of the parallel role is called
SWEEP_STEPS = 8  # most steps per sweep run (record M1: 8; record M2: 6)
SCHEDULES = {"mini_batches": ("C3", "-", "mini_batches"), "merged": ("C0", "--", "merged")}


def saved_file(run_dir: Path, name: str) -> Path:
    """``name`` in the run folder, or in its newest checkpoint (a run stopped before its end saves only there)."""
    checkpoints = sorted(run_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]), reverse=True)
    for folder in (run_dir, *checkpoints):
        if (folder / name).is_file():
            return folder / name
    raise FileNotFoundError(f"{run_dir} holds no {name}, nor any checkpoint of it.")


def run_folders(root: Path) -> list[Path]:
    """The run folders under ``root``: finished (``trainer_state.json``) or stopped after a checkpoint."""
    states = [*root.glob("*/trainer_state.json"), *root.glob("*/checkpoint-*/trainer_state.json")]
    return sorted({state.parent if state.parent.parent == root else state.parent.parent for state in states})


def run_rows(run_dir: Path, part: str) -> list[dict]:
    """The CSV rows of one run folder: per role every step's value (``part="sweep"`` or ``"long"``)."""
    config = json.loads(saved_file(run_dir, "multiagent_config.json").read_text())
    args = load_training_args(saved_file(run_dir, "training_args.bin"))
    history = read_log_history(run_dir)
    workflow = config["workflow"]["workflow"]
    parallel, count = PARALLEL[workflow]
    steps = max(step for step, _ in step_series(history, "workflow/success"))
    run = {
        "part": part,
        "workflow": workflow,
        "instances": config["workflow"][count],
        "schedule": args.update_schedule,
        "seed": args.seed,
        "steps": steps,
    }
    rows = []

    def add(role: str, metric: str, points: list[tuple[int, float]]) -> None:
        rows.extend({**run, "role": role, "step": step, "metric": metric, "value": value} for step, value in points)

    add("", "success", step_series(history, "workflow/success"))
    for role, adapter in config["role_to_adapter"].items():
        for metric in ROLE_METRICS:
            add(role, metric, step_series(history, f"role/{role}/{metric}"))
        add(role, "grad_norm_per_update", per_update_grad_norm(history, role, adapter))
    rows.extend(
        {**run, "role": role, "step": step, "metric": f"alarm/{kind}", "value": 1.0}
        for step, role, kind in alarm_steps(history)
    )
    assert parallel in config["role_to_adapter"], (run_dir, parallel)
    return rows


def collect(
    sweep_roots: list[Path], long_roots: list[Path], out: Path = DATA, *, sweep_steps: int = SWEEP_STEPS
) -> Path:
    """Write the CSV of the run folders under ``sweep_roots`` (their first ``sweep_steps`` steps) and
    ``long_roots``."""
    rows = []
    for part, roots in (("sweep", sweep_roots), ("long", long_roots)):
        for root in roots:
            for run_dir in run_folders(root):
                rows.extend(run_rows(run_dir, part))
    # Three seed-1 runs ran 12 steps before the sweep was cut to 8: with a constant learning rate their first 8
    # steps are an 8-step run's.
    rows = [
        {**row, "steps": min(row["steps"], sweep_steps)}
        for row in rows
        if row["part"] == "long" or row["step"] <= sweep_steps
    ]
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})
    return out


def read_rows(path: Path = DATA) -> list[dict]:
    numbers = ("instances", "seed", "steps", "step")
    with path.open() as f:
        return [
            {**row, **{k: int(row[k]) for k in numbers}, "value": float(row["value"])} for row in csv.DictReader(f)
        ]


def sweep_points(
    rows: list[dict], workflow: str, role: str, metric: str, statistic=statistics.median
) -> dict[str, dict[int, list[float]]]:
    """Schedule -> instance count -> each seed's ``statistic`` of ``metric`` over its steps (by default the median:
    a step's chi-square is heavy-tailed, one step can outweigh the other seven)."""
    steps: dict[tuple, list[float]] = defaultdict(list)
    for row in rows:
        if (row["part"], row["workflow"], row["role"], row["metric"]) == ("sweep", workflow, role, metric):
            steps[row["schedule"], row["instances"], row["seed"]].append(row["value"])
    points: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for (schedule, instances, _), values in sorted(steps.items()):
        points[schedule][instances].append(statistic(values))
    return points


def _sweep_lines(ax, rows: list[dict], *, workflow: str, role: str, metric: str, single: bool = False) -> None:
    """One line per schedule: the mean over seeds against the instance count, its 95% interval as a bar, each seed
    as a dot; ``single``: the workflow's role with one call per episode, drawn thin and grey."""
    points = sweep_points(rows, workflow, role, metric)
    for offset, (schedule, (color, style, label)) in zip((-0.06, 0.06), SCHEDULES.items()):
        counts = sorted(points.get(schedule, {}))
        if not counts:
            continue
        xs = [n * (1 + offset) for n in counts]
        means, lows, highs = zip(*(seed_interval(points[schedule][n], log=True) for n in counts))
        if single:
            ax.plot(xs, means, style, color="0.55", linewidth=1, marker=".", label=f"{role}, {schedule}")
            continue
        ax.plot(xs, means, style, color=color, label=f"{INSTANCE[role]}s, {label}", marker="o")
        for x, low, high, n in zip(xs, lows, highs, counts):
            if not math.isnan(low):
                ax.plot([x, x], [max(low, 0), high], color=color, linewidth=3, alpha=0.35)
            ax.plot([x] * len(points[schedule][n]), points[schedule][n], ".", color=color, alpha=0.5)


def _sweep_panel(ax, rows: list[dict], *, workflow: str, metric: str, title: str, ylabel: str) -> None:
    parallel = PARALLEL[workflow][0]
    single = [role for role in {r["role"] for r in rows if r["workflow"] == workflow} if role and role != parallel]
    _sweep_lines(ax, rows, workflow=workflow, role=parallel, metric=metric)
    for role in sorted(single):
        if role in ("aggregator", "synthesizer"):  # the judge with one call per episode
            _sweep_lines(ax, rows, workflow=workflow, role=role, metric=metric, single=True)
    counts = sorted({r["instances"] for r in rows if r["workflow"] == workflow and r["part"] == "sweep"})
    ax.set_xscale("log")
    ax.set_xticks(counts, [str(n) for n in counts])
    ax.set_xticks([], minor=True)
    ax.set_xlabel(f"{INSTANCE[parallel]}s per episode")
    ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    ax.set_title(title)


def draw(rows: list[dict], out: Path = OUT) -> Path:
    from matplotlib import rc_context
    from matplotlib.figure import Figure

    style = {"font.size": 11, "axes.titlesize": 12, "legend.fontsize": 9}
    size = "update chi-square per step\n(each seed's median over its steps)"
    with rc_context(style):
        figure = Figure(figsize=(11, 8.5), dpi=100, layout="constrained")
        (a, b), (c, d) = figure.subplots(2, 2)
        _sweep_panel(a, rows, workflow="Voting", metric="update_chi_square", title="Voting: update size", ylabel=size)
        a.legend(loc="upper left")
        _sweep_panel(
            b,
            rows,
            workflow="Voting",
            metric="grad_norm",
            title="Voting: gradient norm before clipping",
            ylabel="norm over the step's updates\n(each seed's median over its steps)",
        )
        if any(r["workflow"] == "OrchWorkers" for r in rows):
            _sweep_panel(
                c,
                rows,
                workflow="OrchWorkers",
                metric="update_chi_square",
                title="Orch-Workers: update size",
                ylabel=size,
            )
            c.legend(loc="upper left")
        _long_panel(d, rows)
        figure.savefig(out)
    return out


def _long_panel(ax, rows: list[dict]) -> None:
    long = [row for row in rows if row["part"] == "long"]
    if not long:
        return
    ((workflow, instances, schedule, seed),) = {
        (r["workflow"], r["instances"], r["schedule"], r["seed"]) for r in long
    }
    parallel = PARALLEL[workflow][0]

    def series(metric: str, role: str = "") -> tuple[list[int], list[float]]:
        points = sorted((r["step"], r["value"]) for r in long if r["metric"] == metric and r["role"] == role)
        return [s for s, _ in points], [v for _, v in points]

    steps, success = series("success")
    ax.plot(steps, success, ".", color="0.6", markersize=3)
    ax.plot(steps, running_mean(success, 10), color="k", label="success (running mean of 10 steps)")
    alarms: dict[tuple[str, str], list[int]] = defaultdict(list)
    for r in long:
        if r["metric"].startswith("alarm/"):
            alarms[r["role"], r["metric"].removeprefix("alarm/")].append(r["step"])
    for color, ((role, kind), at) in zip(("C1", "C2", "C4", "C5", "C6", "C8"), sorted(alarms.items())):
        for i, step in enumerate(sorted(at)):
            ax.axvline(
                step, color=color, linestyle=":", linewidth=1, label=f"alarm: {role} {kind}" if i == 0 else None
            )
    twin = ax.twinx()
    for role, color in ((parallel, "C3"), ("aggregator", "0.55")):
        steps, size = series("update_chi_square", role)
        if steps:
            twin.plot(
                steps,
                running_mean(size, 10),
                color=color,
                linewidth=1.2,
                label=f"{INSTANCE.get(role, role)} update chi-square",
            )
    twin.set_yscale("log")
    twin.set_ylabel("update chi-square (running mean of 10)")
    ax.set_title(f"{workflow}, {instances} {INSTANCE[parallel]}s, {schedule}, seed {seed}: {max(steps)} steps")
    ax.set_xlabel("training step")
    ax.set_ylabel("success")
    handles = [h for axis in (ax, twin) for h in axis.get_legend_handles_labels()[0]]
    ax.legend(handles=handles, loc="lower right")


def _cell(values: list[float], *, log: bool) -> str:
    """The mean over seeds [95% interval]: geometric for sizes (``log``), two decimals otherwise; one seed, its
    value."""
    digits = ".2g" if log else ".2f"
    mean, low, high = seed_interval(values, log=log)
    if len(values) == 1 or math.isnan(low):
        return f"{mean:{digits}}"
    return f"{mean:{digits}} [{low:{digits}}, {high:{digits}}]"


def sweep_table(rows: list[dict], workflow: str) -> str:
    """The sweep's table of docs/toy-records.md: per instance count and schedule, the geometric mean over seeds of
    each seed's median over its steps with its 95% interval (success: the mean of its steps), and the largest step's
    update chi-square of any seed."""
    parallel = PARALLEL[workflow][0]
    single = {"Voting": "aggregator", "OrchWorkers": "synthesizer"}[workflow]
    name = INSTANCE[parallel]
    columns = [
        (parallel, "update_chi_square", f"{name}s' update chi-square", statistics.median),
        (parallel, "update_chi_square", "largest step's (any seed)", max),
        (parallel, "chi_square", f"{name}s' chi-square in the loss", statistics.median),
        (parallel, "grad_norm", f"{name}s' gradient norm (step)", statistics.median),
        (parallel, "grad_norm_per_update", "per update", statistics.median),
        (single, "update_chi_square", f"{single}'s update chi-square", statistics.median),
        ("", "success", "success", statistics.fmean),
    ]
    found = [sweep_points(rows, workflow, role, metric, statistic) for role, metric, _, statistic in columns]
    counts = sorted({n for points in found for by in points.values() for n in by})
    lines = [
        f"| {name}s | schedule | seeds | " + " | ".join(title for _, _, title, _ in columns) + " |",
        "| --- " * (len(columns) + 3) + "|",
    ]
    for n in counts:
        for schedule in SCHEDULES:
            cells = []
            for (_, metric, _, statistic), points in zip(columns, found):
                values = points.get(schedule, {}).get(n, [])
                if not values:
                    cells.append("-")
                elif statistic is max:
                    cells.append(f"{max(values):.2g}")
                else:
                    cells.append(_cell(values, log=metric != "success"))
            seeds = len(found[0].get(schedule, {}).get(n, []))
            if seeds:
                lines.append(f"| {n} | {schedule} | {seeds} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def long_table(rows: list[dict], window: int = 20) -> str:
    """The long run's table of docs/toy-records.md: per window of ``window`` steps, the mean success, the median
    update chi-square and the mean entropy of the parallel role and of the one-call judge, and the alarms raised."""
    long = [row for row in rows if row["part"] == "long"]
    workflow = long[0]["workflow"]
    parallel, single = PARALLEL[workflow][0], {"Voting": "aggregator", "OrchWorkers": "synthesizer"}[workflow]
    name = INSTANCE[parallel]
    columns = [
        ("", "success", "success", statistics.fmean, ".2f"),
        (parallel, "update_chi_square", f"{name}s' update chi-square (median)", statistics.median, ".2g"),
        (single, "update_chi_square", f"{single}'s (median)", statistics.median, ".2g"),
        (parallel, "entropy", f"{name}s' entropy", statistics.fmean, ".3f"),
        (single, "entropy", f"{single}'s entropy", statistics.fmean, ".3f"),
    ]
    last = max(row["step"] for row in long)
    lines = [
        "| steps | " + " | ".join(title for _, _, title, _, _ in columns) + " | alarms (role: kind at step) |",
        "| --- " * (len(columns) + 2) + "|",
    ]
    for first in range(1, last + 1, window):
        inside = [row for row in long if first <= row["step"] < first + window]
        cells = []
        for role, metric, _, statistic, digits in columns:
            values = [row["value"] for row in inside if (row["role"], row["metric"]) == (role, metric)]
            cells.append(f"{statistic(values):{digits}}" if values else "-")
        alarms = sorted(
            (row["step"], row["role"], row["metric"]) for row in inside if row["metric"].startswith("alarm")
        )
        said = ", ".join(f"{role}: {metric.removeprefix('alarm/')} at {step}" for step, role, metric in alarms)
        lines.append(f"| {first}-{min(first + window - 1, last)} | " + " | ".join(cells) + f" | {said or '-'} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--collect", type=Path, nargs="*", default=None, help="sweep run roots: rebuild the CSV")
    parser.add_argument("--long", type=Path, nargs="*", default=[], help="long run roots (with --collect)")
    parser.add_argument("--tables", action="store_true", help="print the records' sweep tables, draw nothing")
    args = parser.parse_args()
    if args.collect is not None:
        print(f"wrote {collect(args.collect, args.long, args.data)}")
    rows = read_rows(args.data)
    if args.tables:
        for workflow in sorted({row["workflow"] for row in rows if row["part"] == "sweep"}, reverse=True):
            print(f"{workflow}:\n\n{sweep_table(rows, workflow)}\n")
        if any(row["part"] == "long" for row in rows):
            print(f"The long run:\n\n{long_table(rows)}\n")
        return
    print(f"wrote {draw(rows, args.out)}")


if __name__ == "__main__":
    main()
