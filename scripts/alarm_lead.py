"""Judge early-warning alarms on docs/data/alarm_corpus.csv: lead time before each decline, false alarms per 1,000.

    python scripts/alarm_corpus.py          # builds the corpus (see its docstring for the runs' commands)
    python scripts/alarm_lead.py            # prints docs/monitoring.md's table, draws docs/images/alarm_lead.png
    python scripts/alarm_lead.py --no-plot  # the table only (no matplotlib needed)

1. Runs of at least `MIN_STEPS` steps (a shorter run cannot show a fall that its running mean would resolve).
2. Each run's decline and onset (`decline_onset`: the running mean of 10 steps of success 0.15 below its best so far
   for 10 steps).
3. The split, by seed: seed 1's runs tune, every other seed's are held out.
4. The new alarm, `entropy_rebound` (any role's running mean of 10 steps of entropy above `factor` times its lowest so
   far), has one parameter: on the tuning runs, the factors that warn the most declines at least `MIN_LEAD` steps
   ahead with at most one false alarm per 1,000 steps; the median of those is kept.
5. On the held-out runs, the new alarm and each of today's kinds (the `alarm/...` metrics the runs logged), side by
   side: declines warned >= `MIN_LEAD` steps ahead (exact binomial 95% interval), their lead times, false alarms per
   1,000 steps of watched steps (exact Poisson 95% interval).
"""

from __future__ import annotations

import argparse
import csv
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from trl_multiagent.evaluation.alarm_lead import (
    RunScore,
    binomial_interval,
    decline_onset,
    poisson_interval,
    rebound,
    rebound_alarms,
    score_run,
)
from trl_multiagent.evaluation.mechanisms import running_mean

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "docs" / "data" / "alarm_corpus.csv"
OUT = ROOT / "docs" / "images" / "alarm_lead.png"
MIN_STEPS = 20  # a decline needs its running mean (10 steps) and its hold (10 steps)
WINDOW = 10  # the running mean of success and of entropy, in steps
DROP, HOLD = 0.15, 10
HORIZON = 30  # an alarm more than this many steps before the onset is a false alarm
MIN_LEAD = 10  # the target: a warning at least this many steps before the onset
TUNING_SEEDS = {1}
FACTORS = [round(1.1 + 0.05 * i, 2) for i in range(31)]  # 1.10 .. 2.60


@dataclass
class Run:
    name: str
    source: str
    setting: str
    seed: int
    series: dict[tuple[str, str], list[tuple[int, float]]] = field(default_factory=lambda: defaultdict(list))

    @property
    def success(self) -> list[tuple[int, float]]:
        return sorted(self.series["", "success"])

    @property
    def last_step(self) -> int:
        return max(step for step, _ in self.success)

    @property
    def onset(self) -> int | None:
        return decline_onset(self.success, window=WINDOW, drop=DROP, hold=HOLD)

    def logged_alarms(self, kind: str | None = None) -> list[int]:
        """The steps of today's alarms the run logged, of ``kind`` (any kind: None), one per step."""
        return sorted(
            {
                step
                for (role, metric), points in self.series.items()
                if metric.startswith("alarm/") and kind in (None, metric.removeprefix("alarm/"))
                for step, _ in points
            }
        )

    def entropy_rebound_alarms(self, factor: float) -> list[int]:
        """The new alarm's steps: any role's entropy rebound above ``factor``, one per step."""
        roles = [role for role, metric in self.series if metric == "entropy"]
        return sorted(
            {
                s
                for role in roles
                for s in rebound_alarms(sorted(self.series[role, "entropy"]), window=WINDOW, factor=factor)
            }
        )


def read_runs(path: Path = DATA) -> list[Run]:
    runs: dict[str, Run] = {}
    with path.open() as f:
        for row in csv.DictReader(f):
            run = runs.setdefault(row["run"], Run(row["run"], row["source"], row["setting"], int(row["seed"])))
            run.series[row["role"], row["metric"]].append((int(row["step"]), float(row["value"])))
    return [run for run in runs.values() if len(run.success) >= MIN_STEPS]


@dataclass(frozen=True)
class Verdict:
    """An alarm's record over a set of runs."""

    declines: int
    warned: int  # declines warned at least MIN_LEAD steps ahead
    leads: list[int]  # every warned decline's lead time (any lead)
    false_alarms: int
    steps: int

    @property
    def rate(self) -> float:
        return 1000 * self.false_alarms / self.steps


def judge(runs: list[Run], alarms_of) -> Verdict:
    scores: list[RunScore] = [
        score_run(alarms_of(run), onset=run.onset, last_step=run.last_step, horizon=HORIZON) for run in runs
    ]
    leads = [s.lead for s in scores if s.lead is not None]
    return Verdict(
        declines=sum(s.onset is not None for s in scores),
        warned=sum(lead >= MIN_LEAD for lead in leads),
        leads=leads,
        false_alarms=sum(s.false_alarms for s in scores),
        steps=sum(s.steps_watched for s in scores),
    )


def tune(runs: list[Run]) -> tuple[float, list[float]]:
    """The kept factor and every factor that met the target on ``runs``."""
    verdicts = {factor: judge(runs, lambda run, f=factor: run.entropy_rebound_alarms(f)) for factor in FACTORS}
    allowed = {f: v for f, v in verdicts.items() if v.rate <= 1.0}
    if not allowed:
        raise SystemExit("No factor keeps the tuning runs' false alarms at or below 1 per 1,000 steps.")
    best = max(v.warned for v in allowed.values())
    feasible = sorted(f for f, v in allowed.items() if v.warned == best)
    return statistics.median_low(feasible), feasible


def _cell(verdict: Verdict) -> list[str]:
    if verdict.declines:
        low, high = binomial_interval(verdict.warned, verdict.declines)
        warned = f"{verdict.warned} of {verdict.declines} [{low:.2f}, {high:.2f}]"
    else:
        warned = "no declines"
    leads = ", ".join(str(lead) for lead in sorted(verdict.leads)) or "-"
    low, high = poisson_interval(verdict.false_alarms, verdict.steps)
    rate = f"{verdict.rate:.1f} [{low:.1f}, {high:.1f}] ({verdict.false_alarms} in {verdict.steps})"
    return [warned, leads, rate]


def table(runs: list[Run], factor: float) -> str:
    held = [run for run in runs if run.seed not in TUNING_SEEDS]
    tuning = [run for run in runs if run.seed in TUNING_SEEDS]
    kinds = sorted({m.removeprefix("alarm/") for run in runs for _, m in run.series if m.startswith("alarm/")})
    candidates = [(f"entropy_rebound (new, factor {factor})", lambda run: run.entropy_rebound_alarms(factor))]
    candidates.append(("any of today's alarms", lambda run: run.logged_alarms()))
    candidates += [(f"today's {kind}", lambda run, k=kind: run.logged_alarms(k)) for kind in kinds]
    lines = [
        f"| alarm | runs | declines warned >= {MIN_LEAD} steps ahead [95% CI] | lead times (steps) | "
        "false alarms per 1,000 steps [95% CI] (count in watched steps) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, alarms_of in candidates:
        for part, chosen in (("held out", held), ("tuning", tuning)):
            lines.append(f"| {name} | {part} | " + " | ".join(_cell(judge(chosen, alarms_of))) + " |")
    return "\n".join(lines)


def corpus_summary(runs: list[Run]) -> str:
    lines = ["| run | source | setting | seed | steps | decline onset |", "| --- | --- | --- | --- | --- | --- |"]
    for run in sorted(runs, key=lambda r: (r.source, r.name)):
        onset = run.onset
        lines.append(f"| {run.name} | {run.source} | {run.setting} | {run.seed} | {run.last_step} | {onset or '-'} |")
    steps = sum(run.last_step for run in runs)
    declines = sum(run.onset is not None for run in runs)
    lines.append(f"\n{len(runs)} runs, {steps} steps, {declines} declines.")
    return "\n".join(lines)


def draw(runs: list[Run], factor: float, out: Path = OUT) -> Path:
    from matplotlib.figure import Figure

    declining = [run for run in runs if run.onset is not None]
    figure = Figure(figsize=(11, 3.6 * ((len(declining) + 2) // 2)), dpi=100, layout="constrained")
    axes = figure.subplots((len(declining) + 2) // 2, 2, squeeze=False).ravel()
    for ax, run in zip(axes, declining):
        steps = [s for s, _ in run.success]
        ax.plot(steps, running_mean([v for _, v in run.success], WINDOW), color="k", label="success (mean of 10)")
        ax.axvline(run.onset, color="k", linestyle="--", label=f"decline onset ({run.onset})")
        ax.axvspan(
            max(run.onset - HORIZON, 0),
            max(run.onset - MIN_LEAD, 0),
            color="C2",
            alpha=0.12,
            label="warning >= 10 ahead",
        )
        for step in run.logged_alarms():
            ax.axvline(step, color="C1", linestyle=":", linewidth=1)
        ax.plot([], [], color="C1", linestyle=":", label="today's alarms")
        twin = ax.twinx()
        for color, role in zip(("C3", "C0", "C4"), sorted({r for r, m in run.series if m == "entropy"})):
            ratios = rebound(sorted(run.series[role, "entropy"]), window=WINDOW)
            twin.plot([s for s, _ in ratios], [r for _, r in ratios], color=color, label=f"{role} entropy rebound")
        twin.axhline(factor, color="C3", linewidth=0.8, linestyle="-.")
        for step in run.entropy_rebound_alarms(factor):
            twin.plot([step], [factor], "v", color="k", markersize=8)
        twin.set_ylabel("entropy over its lowest (mean of 10)")
        ax.set_title(f"{run.name} ({'tuning' if run.seed in TUNING_SEEDS else 'held out'})", fontsize=10)
        ax.set_xlabel("training step")
        ax.set_ylabel("success")
        handles = [h for axis in (ax, twin) for h in axis.get_legend_handles_labels()[0]]
        ax.legend(handles=handles, fontsize=7, loc="lower left")
    ax = axes[len(declining)]
    peaks = []
    for run in runs:
        until = run.onset - MIN_LEAD if run.onset else run.last_step + 1
        ratios = [
            r
            for role, m in run.series
            if m == "entropy"
            for s, r in rebound(sorted(run.series[role, "entropy"]), window=WINDOW)
            if s < until
        ]
        if ratios:
            peaks.append((max(ratios), run))
    for i, (peak, run) in enumerate(sorted(peaks, key=lambda p: p[0])):
        color = "C3" if run.onset else "0.5"
        marker = "o" if run.seed in TUNING_SEEDS else "s"
        ax.plot([peak], [i], marker, color=color)
    ax.axvline(factor, color="C3", linestyle="-.", label=f"tuned factor {factor}")
    ax.plot([], [], "o", color="C3", label="declining run (before onset - 10)")
    ax.plot([], [], "o", color="0.5", label="run without a decline")
    ax.plot([], [], "s", color="k", fillstyle="none", label="square: held out; circle: tuning")
    ax.set_xlabel("largest entropy rebound (any role)")
    ax.set_ylabel("runs, sorted")
    ax.set_title("Each run's largest rebound where a warning would count", fontsize=10)
    ax.legend(fontsize=7, loc="lower right")
    for extra in axes[len(declining) + 1 :]:
        extra.set_visible(False)
    figure.savefig(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--no-plot", action="store_true")
    args = parser.parse_args()
    runs = read_runs(args.data)
    factor, feasible = tune([run for run in runs if run.seed in TUNING_SEEDS])
    print(corpus_summary(runs))
    print(
        f"\nTuned on seeds {sorted(TUNING_SEEDS)}: factors meeting the target {feasible[0]}-{feasible[-1]}, "
        f"kept {factor}\n"
    )
    print(table(runs, factor))
    if not args.no_plot:
        print(f"wrote {draw(runs, factor, args.out)}")


if __name__ == "__main__":
    main()
