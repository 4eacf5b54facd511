"""Monitoring: per-role metrics of each generation batch and alarms on the drift signatures the paper reports."""

from .adapter_check import AdapterMismatchError
from .drift import DriftAlarm, DriftThresholds, RoleDriftCallback
from .summary import TrainingSummaryCallback, plot_summary, summary_table
from .workflow_metrics import workflow_metrics


def monitoring_callbacks(args, formats) -> tuple[list, list]:
    """The callbacks ``args`` asks for, for a workflow declaring ``formats`` (role type -> output format): (to run
    before every other callback, to run after them)."""
    first = []
    if args.drift_alarms:
        thresholds = DriftThresholds(**(args.drift_thresholds or {}))
        first.append(RoleDriftCallback(thresholds, formats, stop_on_alarm=args.stop_on_drift))
    return first, [TrainingSummaryCallback()] if args.training_summary else []


__all__ = [
    "AdapterMismatchError",
    "DriftAlarm",
    "DriftThresholds",
    "RoleDriftCallback",
    "TrainingSummaryCallback",
    "monitoring_callbacks",
    "plot_summary",
    "summary_table",
    "workflow_metrics",
]
