"""Monitoring: per-role metrics of each generation batch and alarms on the drift signatures the paper reports."""

from .drift import DriftAlarm, DriftThresholds, RoleDriftCallback
from .summary import TrainingSummaryCallback, plot_summary, summary_table
from .workflow_metrics import workflow_metrics

__all__ = [
    "DriftAlarm",
    "DriftThresholds",
    "RoleDriftCallback",
    "TrainingSummaryCallback",
    "plot_summary",
    "summary_table",
    "workflow_metrics",
]
