"""End-of-training summary: how success, the workflow's metrics and every per-role metric moved, as text and a PNG.

``TrainingSummaryCallback`` reads the trainer's ``state.log_history``: ``workflow/success``, the other
``workflow/...`` metrics (who was right: ``workflow/regraded/<role>``, ``workflow/verdict_accuracy``,
``workflow/selection_accuracy``, retries, ...) and every ``role/<role>/<metric>`` key, so a metric added later shows
up without changes here. When training ends it prints the mean of the first and of the last ``window`` logged values
of each (a row per metric, a column per role for the role metrics) and saves ``training_summary.png`` (each metric
over steps, one line per role) in ``output_dir``, next to the checkpoints.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections import defaultdict
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

logger = logging.getLogger(__name__)

SUCCESS = "workflow/success"
PLOT_FILE = "training_summary.png"
_BOOKKEEPING = ("workflow/samples_generated", "workflow/samples_trained")  # equal by design; nothing to watch
_ROLE_METRIC = re.compile(r"^role/(?P<role>[^/]+)/(?P<metric>.+)$")

Series = list[tuple[int, float]]  # (global step, logged value), in logging order


def metric_series(log_history: list[dict[str, Any]]) -> tuple[dict[str, Series], dict[str, dict[str, Series]]]:
    """``workflow/...`` key -> series (``workflow/success`` first), and metric -> role -> series of every
    ``role/<role>/<metric>`` key; roles in the order they were first logged."""
    workflow: dict[str, Series] = defaultdict(list)
    roles: dict[str, dict[str, Series]] = defaultdict(lambda: defaultdict(list))
    for entry in log_history:
        step = entry.get("step", 0)
        for key, value in entry.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                continue
            if key.startswith("workflow/") and key not in _BOOKKEEPING:
                workflow[key].append((step, float(value)))
            elif match := _ROLE_METRIC.match(key):
                roles[match["metric"]][match["role"]].append((step, float(value)))
    ordered = {SUCCESS: workflow.pop(SUCCESS)} if SUCCESS in workflow else {}
    ordered |= dict(sorted(workflow.items()))
    return ordered, {metric: dict(by_role) for metric, by_role in sorted(roles.items())}


def _first_last(series: Series, window: int) -> str:
    values = [value for _, value in series]
    first, last = values[:window], values[-window:]
    return f"{sum(first) / len(first):.4g} -> {sum(last) / len(last):.4g}"


def _columns(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]


def summary_table(log_history: list[dict[str, Any]], window: int = 5) -> str:
    """The workflow's metrics, then a row per role metric and a column per role: ``first -> last``, the means of
    the first and last ``window`` logged values."""
    workflow, by_metric = metric_series(log_history)
    if not workflow and not by_metric:
        return "No workflow/... or role/<role>/... metrics were logged."
    steps = max(series[-1][0] for series in [*workflow.values(), *(s for r in by_metric.values() for s in r.values())])
    lines = [f"Training summary over {steps} steps (mean of the first -> last {window} logged values)"]
    if workflow:
        lines += _columns([(key, _first_last(series, window)) for key, series in workflow.items()])
    if by_metric:
        roles = list(dict.fromkeys(role for by_role in by_metric.values() for role in by_role))
        rows = [("role/<role>/...", *roles)]
        for metric, by_role in by_metric.items():
            rows.append((metric, *(_first_last(by_role[role], window) if role in by_role else "" for role in roles)))
        lines += [""] + _columns(rows)
    return "\n".join(lines)


def plot_summary(log_history: list[dict[str, Any]], path: str, columns: int = 4) -> str | None:
    """Save every workflow metric and every per-role metric over steps to ``path`` (PNG); ``None`` if none."""
    from matplotlib.figure import Figure  # the object API: no pyplot state, no global backend switch

    workflow, by_metric = metric_series(log_history)
    panels = [(key, {"workflow": series}) for key, series in workflow.items()]
    panels += [(f"role/<role>/{metric}", by_role) for metric, by_role in by_metric.items()]
    if not panels:
        return None
    rows = math.ceil(len(panels) / columns)
    figure = Figure(figsize=(4 * columns, 2.8 * rows))
    axes = figure.subplots(rows, columns, squeeze=False).flatten()
    for ax, (title, by_role) in zip(axes, panels):
        for role, series in by_role.items():
            steps, values = zip(*series)
            ax.plot(steps, values, label=role, linewidth=1.2)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        if len(by_role) > 1 or title.startswith("role/"):
            ax.legend(fontsize=7)
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    figure.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    figure.savefig(path, dpi=90)
    return path


class TrainingSummaryCallback(TrainerCallback):
    """Print the summary table and save ``training_summary.png`` in ``output_dir`` when training ends.

    Args:
        window: how many logged values are averaged at the start and at the end of the table.
    """

    def __init__(self, window: int = 5):
        self.window = window

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        if not state.is_world_process_zero:
            return
        print(summary_table(state.log_history, self.window))
        try:
            path = plot_summary(state.log_history, os.path.join(args.output_dir, PLOT_FILE))
        except ImportError:
            logger.warning("No %s: the plot needs matplotlib (pip install 'trl-multiagent[plots]').", PLOT_FILE)
            return
        if path:
            print(f"Saved {path}")
