"""End-of-training summary: how success, the workflow's metrics and every per-role metric moved, as text and a PNG.

``TrainingSummaryCallback`` reads the trainer's ``state.log_history``: ``workflow/success``, the other
``workflow/...`` metrics (who was right: ``workflow/regraded/<role>``, ``workflow/verdict_accuracy``,
``workflow/selection_accuracy``, retries, ...) and every ``role/<role>/<metric>`` key, so a metric added later shows
up without changes here. When training ends it prints the mean of the first and of the last ``window`` logged values
of each (a row per metric, a column per role for the role metrics), saves ``training_summary.png`` (the picture of
``summary_plot.py``: success, each role's length, entropy and gradient share, each judge's accuracy, the alarms) in
``output_dir``, next to the checkpoints, sends it to the run's TensorBoard when ``report_to`` has one, and saves the
trainer state (``trainer_state.json``, with the whole log history) there for ``trl-multiagent report``.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.integrations import TensorBoardCallback

from .summary_plot import SUCCESS, plot_summary

logger = logging.getLogger(__name__)

PLOT_FILE = "training_summary.png"
STATE_FILE = "trainer_state.json"  # the name Trainer.save_state gives it
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


@dataclass
class FirstLast:
    """The end-of-run table: each metric as ``first -> last``, the means of its first and last ``window`` values."""

    steps: int  # the last logged step
    window: int
    workflow: list[tuple[str, str]]  # (workflow/... key, "first -> last")
    roles: list[str]  # the role columns, in the order they were first logged
    role_rows: list[tuple[str, ...]]  # (metric, a cell per role: "first -> last", or "" where the role lacks it)


def first_last(log_history: list[dict[str, Any]], window: int = 5) -> FirstLast | None:
    """How each workflow metric and each role's metrics moved; ``None`` when none was logged."""
    workflow, by_metric = metric_series(log_history)
    if not workflow and not by_metric:
        return None
    steps = max(series[-1][0] for series in [*workflow.values(), *(s for r in by_metric.values() for s in r.values())])
    roles = list(dict.fromkeys(role for by_role in by_metric.values() for role in by_role))
    rows = [
        (metric, *(_first_last(by_role[role], window) if role in by_role else "" for role in roles))
        for metric, by_role in by_metric.items()
    ]
    return FirstLast(steps, window, [(key, _first_last(s, window)) for key, s in workflow.items()], roles, rows)


def summary_table(log_history: list[dict[str, Any]], window: int = 5) -> str:
    """The workflow's metrics, then a row per role metric and a column per role: ``first -> last``, the means of
    the first and last ``window`` logged values."""
    table = first_last(log_history, window)
    if table is None:
        return "No workflow/... or role/<role>/... metrics were logged."
    lines = [f"Training summary over {table.steps} steps (mean of the first -> last {window} logged values)"]
    if table.workflow:
        lines += _columns(table.workflow)
    if table.role_rows:
        lines += [""] + _columns([("role/<role>/...", *table.roles), *table.role_rows])
    return "\n".join(lines)


class TrainingSummaryCallback(TrainerCallback):
    """When training ends: print the summary table, save ``training_summary.png`` and ``trainer_state.json`` in
    ``output_dir``, and add the picture to the run's TensorBoard when ``report_to`` has one.

    Args:
        window: how many logged values are averaged at the start and at the end of the table.
        judges: role -> ``"verdict"`` or ``"selection"``, the roles whose declared format judges other roles
            (``summary_plot.judge_roles(workflow.formats)``); ``None`` finds the verdict roles in the log.
        trackers: the trainer's callbacks (``trainer.callback_handler.callbacks``), read when training ends: the
            ``report_to`` integrations among them that take images get the picture (TensorBoard's).
    """

    def __init__(
        self,
        window: int = 5,
        judges: Mapping[str, str] | None = None,
        trackers: Sequence[TrainerCallback] = (),
    ):
        self.window = window
        self.judges = judges
        self.trackers = trackers

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        if not state.is_world_process_zero:
            return
        print(summary_table(state.log_history, self.window))
        state.save_to_json(os.path.join(args.output_dir, STATE_FILE))
        try:
            path = plot_summary(state.log_history, os.path.join(args.output_dir, PLOT_FILE), judges=self.judges)
        except ImportError:
            logger.warning("No %s: the plot needs matplotlib (pip install matplotlib).", PLOT_FILE)
            return
        if path:
            print(f"Saved {path}")
            for tracker in self.trackers:
                if isinstance(tracker, TensorBoardCallback) and tracker.logging_dir is not None:
                    add_image_to_tensorboard(path, tracker.logging_dir, state.global_step)


def add_image_to_tensorboard(path: str, logging_dir: str, step: int, tag: str = "training_summary") -> None:
    """Add the PNG at ``path`` to the TensorBoard run in ``logging_dir`` as image ``tag`` at ``step``.

    TensorBoard's callback closes its writer when training ends (before this callback runs); a second writer in the
    same folder writes an event file of its own, which TensorBoard reads as part of the same run.
    """
    from matplotlib.image import imread
    from torch.utils.tensorboard import SummaryWriter

    image = imread(path)  # [H, W, 4] floats in [0, 1]
    with SummaryWriter(log_dir=logging_dir) as writer:
        writer.add_image(tag, image[..., :3], step, dataformats="HWC")
