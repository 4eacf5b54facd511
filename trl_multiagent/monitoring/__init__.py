"""Monitoring: per-role metrics of each generation batch and alarms on the drift signatures the paper reports."""

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .adapter_check import AdapterMismatchError
from .drift import DriftAlarm, DriftThresholds, RoleDriftCallback
from .resources import ResourceMonitorCallback
from .summary import TrainingSummaryCallback, summary_table
from .summary_plot import judge_roles, plot_summary
from .workflow_metrics import workflow_metrics


def monitoring_callbacks(
    args,
    formats: Mapping[str, Any],
    trackers: Sequence = (),
    resume: Callable[[Sequence[str]], str] | None = None,
) -> tuple[list, list]:
    """The callbacks ``args`` asks for, for a workflow declaring ``formats`` (role type -> output format): (to run
    before every other callback, to run after them). The drift alarms and the summary picture know the judges by
    these formats; ``trackers``: the trainer's callback list, whose ``report_to`` integrations get the picture when
    they take images; ``resume(flags)``: how to resume the run with extra flags, printed when a drift alarm stops
    it (``stop_on_drift``)."""
    first = [ResourceMonitorCallback()] if args.monitor_resources else []
    if args.drift_alarms:
        thresholds = DriftThresholds(**(args.drift_thresholds or {}))
        first.append(RoleDriftCallback(thresholds, formats, stop_on_alarm=args.stop_on_drift, resume=resume))
    if not args.training_summary:
        return first, []
    return first, [TrainingSummaryCallback(judges=judge_roles(formats), trackers=trackers)]


__all__ = [
    "AdapterMismatchError",
    "DriftAlarm",
    "DriftThresholds",
    "ResourceMonitorCallback",
    "RoleDriftCallback",
    "TrainingSummaryCallback",
    "judge_roles",
    "monitoring_callbacks",
    "plot_summary",
    "summary_table",
    "workflow_metrics",
]
