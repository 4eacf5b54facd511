"""Draw docs/images/toy_capture.png, the capture figure of docs/toy.md, from docs/data/toy_capture.csv.

    python scripts/toy_capture.py                         # needs matplotlib (pip install -e ".[plots]")
    python scripts/toy_capture.py --out /tmp/toy_capture.png
    python scripts/toy_capture.py --collect outputs/capture

`--collect` rebuilds the CSV from the run folders under the folders it names (shared-policy runs trained with
`monitor_role_grad_norms`; each run's `trainer_state.json`, `multiagent_config.json` and `training_args.bin`); the
records are in docs/toy-records.md (record M4). One row per (run, step, role, metric): each role's share of the
shared adapter's squared gradient norm (`gradient_share`), of the step's model calls (`output_share`) and of their
completion tokens (`token_share`), its `completion_length`, `unparseable`, `entropy` and (a verdict role)
`verdict_balanced_accuracy`, each drift alarm it raised (`alarm/<kind>`, value 1 at its step); per run (role empty)
`success` and the judges' own accuracy, `verdict_accuracy` (Eval-Opt) or `selection_accuracy` (Voting).

The figure: per workflow, the solver's gradient share over the steps under per-output averaging and under the
workflow's equalised shares (`COMPARED`: Voting's `role_loss_balance="per_role"`, Eval-Opt's evaluator weighted),
beside its share of outputs and of tokens; success over the steps under both; and the judge's accuracy (and balanced
verdict accuracy) under both; its length and format are in the table. Lines are means over seeds of a 5-step running
mean.
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path

from trl_multiagent.cli.report import load_training_args
from trl_multiagent.evaluation.instability import read_log_history
from trl_multiagent.evaluation.mechanisms import (
    alarm_steps,
    rise_and_peak,
    role_shares,
    running_mean,
    seed_interval,
    step_series,
)

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "docs" / "data" / "toy_capture.csv"
OUT = ROOT / "docs" / "images" / "toy_capture.png"
COLUMNS = ("workflow", "balance", "seed", "step", "role", "metric", "value")
ROLE_METRICS = ("completion_length", "unparseable", "entropy", "verdict_balanced_accuracy")
RUN_METRICS = ("success", "verdict_accuracy", "selection_accuracy")
# Per workflow: the role whose share is drawn (the other's is one minus it) and the judge with its own accuracy.
WORKFLOWS = {
    "Voting": ("generator", "aggregator", "selection_accuracy"),
    "EvalOpt": ("generator", "evaluator", "verdict_accuracy"),
}
BALANCES = {
    "per_output": ("C3", "per-output averaging"),
    "per_role": ("C0", "per-role balance"),
    "evaluator_x8": ("C2", "evaluator's loss x8"),
}
# What the figure compares per workflow. Eval-Opt's per-role balance is per-output averaging exactly (one evaluator
# call per generator call, and the toy's loss is a sequence mean): its evaluator is equalised by weight instead.
COMPARED = {"Voting": ("per_output", "per_role"), "EvalOpt": ("per_output", "evaluator_x8")}
WINDOW = 5


def balance_label(args) -> str:
    """How a run set its roles' shares of the loss: `role_loss_balance`, or the `role_loss_weights` it set
    (``{"evaluator": 5.0}`` -> ``evaluator_x5``) on top of per-output averaging."""
    weights = args.role_loss_weights
    if isinstance(weights, str):
        weights = json.loads(weights)
    if not weights:
        return args.role_loss_balance
    if args.role_loss_balance != "per_output":
        raise ValueError(f"{args.output_dir}: role_loss_weights on top of {args.role_loss_balance!r} has no label.")
    return "+".join(f"{role}_x{weight:g}" for role, weight in sorted(weights.items()))


def run_rows(run_dir: Path) -> list[dict]:
    config = json.loads((run_dir / "multiagent_config.json").read_text())
    args = load_training_args(run_dir / "training_args.bin")
    if config["policy_sharing"] != "shared":
        raise ValueError(
            f"{run_dir} trained with policy_sharing={config['policy_sharing']!r}: capture needs 'shared'."
        )
    history = read_log_history(run_dir)
    run = {"workflow": config["workflow"]["workflow"], "balance": balance_label(args), "seed": args.seed}
    roles = list(config["role_to_adapter"])
    rows = []
    for share in role_shares(history, roles):
        for name, metric in (("gradient", "gradient_share"), ("outputs", "output_share"), ("tokens", "token_share")):
            if share[name] is not None:
                rows.append(
                    {**run, "step": share["step"], "role": share["role"], "metric": metric, "value": share[name]}
                )
    for role in roles:
        for metric in ROLE_METRICS:
            rows += [
                {**run, "step": s, "role": role, "metric": metric, "value": v}
                for s, v in step_series(history, f"role/{role}/{metric}")
            ]
    for metric in RUN_METRICS:
        rows += [
            {**run, "step": s, "role": "", "metric": metric, "value": v}
            for s, v in step_series(history, f"workflow/{metric}")
        ]
    rows += [
        {**run, "step": step, "role": role, "metric": f"alarm/{kind}", "value": 1.0}
        for step, role, kind in alarm_steps(history)
    ]
    return rows


def collect(roots: list[Path], out: Path = DATA) -> Path:
    rows = [
        row for root in roots for state in sorted(root.glob("*/trainer_state.json")) for row in run_rows(state.parent)
    ]
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})
    return out


def read_rows(path: Path = DATA) -> list[dict]:
    with path.open() as f:
        return [
            {**row, "seed": int(row["seed"]), "step": int(row["step"]), "value": float(row["value"])}
            for row in csv.DictReader(f)
        ]


def seed_mean_curve(
    rows: list[dict], *, workflow: str, balance: str, role: str, metric: str
) -> tuple[list[int], list[float]]:
    """Steps and the mean over seeds of each seed's running mean of ``metric`` (steps every seed logged)."""
    by_seed: dict[int, dict[int, float]] = defaultdict(dict)
    for row in rows:
        if (row["workflow"], row["balance"], row["role"], row["metric"]) == (workflow, balance, role, metric):
            by_seed[row["seed"]][row["step"]] = row["value"]
    if not by_seed:
        return [], []
    steps = sorted(set.intersection(*(set(values) for values in by_seed.values())))
    curves = [running_mean([values[s] for s in steps], WINDOW) for values in by_seed.values()]
    return steps, [sum(values) / len(values) for values in zip(*curves)]


def draw(rows: list[dict], out: Path = OUT) -> Path:
    from matplotlib import rc_context
    from matplotlib.figure import Figure

    style = {"font.size": 11, "axes.titlesize": 12, "legend.fontsize": 9}
    with rc_context(style):
        figure = Figure(figsize=(11, 11), dpi=100, layout="constrained")
        axes = figure.subplots(3, 2)
        for column, (workflow, (solver, judge, accuracy)) in enumerate(WORKFLOWS.items()):
            _workflow_column(
                [row[column] for row in axes], rows, workflow=workflow, solver=solver, judge=judge, accuracy=accuracy
            )
        figure.savefig(out)
    return out


def _workflow_column(axes, rows: list[dict], *, workflow: str, solver: str, judge: str, accuracy: str) -> None:
    """One workflow's panels: the solver's shares of the shared adapter, success, and the judge's own metrics, under
    each balance of ``COMPARED``."""
    shares, success, own = axes

    def curve(balance: str, role: str, metric: str) -> tuple[list[int], list[float]]:
        return seed_mean_curve(rows, workflow=workflow, balance=balance, role=role, metric=metric)

    for balance in COMPARED[workflow]:
        color, label = BALANCES[balance]
        shares.plot(*curve(balance, solver, "gradient_share"), color=color, label=f"gradient, {label}")
        success.plot(*curve(balance, "", "success"), color=color, label=label)
        own.plot(*curve(balance, "", accuracy), color=color, label=f"{accuracy.replace('_', ' ')}, {label}")
        steps, balanced = curve(balance, judge, "verdict_balanced_accuracy")
        if steps:
            own.plot(steps, balanced, "--", color=color, label=f"balanced accuracy, {label}")
    for metric, line in (("output_share", "--"), ("token_share", ":")):
        shares.plot(*curve("per_output", solver, metric), line, color="0.3", label=metric.replace("_", " "))
    shares.set_title(f"{workflow}, shared adapter: the {solver}'s share")
    shares.set_ylim(0, 1)
    shares.set_ylabel(f"share of the step (the rest: the {judge})")
    shares.legend(loc="lower left")
    success.set_title(f"{workflow}: success")
    success.set_ylabel("success (running mean of 5 steps)")
    success.legend(loc="lower right")
    own.set_title(f"{workflow}: the {judge}'s own metrics")
    own.set_xlabel("training step")
    own.set_ylabel(f"{accuracy.replace('_', ' ')} (running mean of 5)")
    own.legend(loc="lower left")


def run_values(rows: list[dict], *, workflow: str, balance: str, role: str, metric: str) -> dict[int, list]:
    """Seed -> ``[(step, value), ...]`` of ``metric``, in step order."""
    found: dict[int, list] = defaultdict(list)
    for row in rows:
        if (row["workflow"], row["balance"], row["role"], row["metric"]) == (workflow, balance, role, metric):
            found[row["seed"]].append((row["step"], row["value"]))
    return {seed: sorted(points) for seed, points in sorted(found.items())}


def _cell(values: list[float], digits: str) -> str:
    mean, low, high = seed_interval(values)
    return f"{mean:{digits}}" if math.isnan(low) else f"{mean:{digits}} [{low:{digits}}, {high:{digits}}]"


def _edges(points: list) -> tuple[float, float]:
    """The means of the first and of the last ``WINDOW`` values."""
    values = [value for _, value in points]
    return statistics.fmean(values[:WINDOW]), statistics.fmean(values[-WINDOW:])


def _judge_alarms(rows: list[dict], *, workflow: str, balance: str, judge: str) -> dict[str, set[int]]:
    """Alarm kind -> the seeds whose judge raised it at least once."""
    found: dict[str, set[int]] = defaultdict(set)
    for row in rows:
        if (row["workflow"], row["balance"], row["role"]) == (workflow, balance, judge) and row["metric"].startswith(
            "alarm/"
        ):
            found[row["metric"].removeprefix("alarm/")].add(row["seed"])
    return dict(sorted(found.items()))


def capture_table(rows: list[dict]) -> str:
    """The records' capture table: per workflow and balance, the means over seeds (95% interval) of the solver's
    shares over the run, of how success rose (`rise_and_peak` over a running mean of ``WINDOW`` steps), and of the
    judge's own metrics over the first and the last ``WINDOW`` steps."""
    header = (
        "| workflow | balance | seeds | solver's gradient share | output share | token share | success, first 5 steps "
        "| peak (running mean of 5) | step of the peak | step of half the rise | judge's accuracy, first -> last 5 "
        "| balanced accuracy, first -> last 5 | judge's length (tokens), first -> last 5 "
        "| judge unparseable, first -> last 5 | seeds with a judge alarm |"
    )
    lines = [header, "| --- " * 15 + "|"]
    for workflow, (solver, judge, accuracy) in WORKFLOWS.items():
        for balance in BALANCES:
            per_seed = functools.partial(run_values, rows, workflow=workflow, balance=balance)
            success = per_seed(role="", metric="success")
            if not success:
                continue
            rises = [rise_and_peak(points, window=WINDOW) for points in success.values()]
            shares = [
                [statistics.fmean(v for _, v in points) for points in per_seed(role=solver, metric=metric).values()]
                for metric in ("gradient_share", "output_share", "token_share")
            ]
            judged = []
            for role, metric, digits in (
                ("", accuracy, ".2f"),
                (judge, "verdict_balanced_accuracy", ".2f"),
                (judge, "completion_length", ".1f"),
                (judge, "unparseable", ".2f"),
            ):
                found = per_seed(role=role, metric=metric).values()
                if not found:
                    judged.append("-")
                    continue
                first, last = zip(*(_edges(points) for points in found))
                judged.append(f"{_cell(list(first), digits)} -> {_cell(list(last), digits)}")
            alarms = _judge_alarms(rows, workflow=workflow, balance=balance, judge=judge)
            judged.append(
                ", ".join(f"{kind}: {len(seeds)} of {len(success)}" for kind, seeds in alarms.items()) or "-"
            )
            cells = [
                *(_cell(values, ".2f") for values in shares),
                _cell([r["start"] for r in rises], ".2f"),
                _cell([r["peak"] for r in rises], ".2f"),
                _cell([r["peak_step"] for r in rises], ".0f"),
                _cell([r["half_rise_step"] for r in rises], ".0f"),
                *judged,
            ]
            lines.append(f"| {workflow} | {balance} | {len(success)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--collect", type=Path, nargs="*", default=None, help="run roots: rebuild the CSV first")
    parser.add_argument("--table", action="store_true", help="print the records' table, draw nothing")
    args = parser.parse_args()
    if args.collect is not None:
        print(f"wrote {collect(args.collect, args.data)}")
    rows = read_rows(args.data)
    if args.table:
        print(capture_table(rows))
        return
    print(f"wrote {draw(rows, args.out)}")


if __name__ == "__main__":
    main()
