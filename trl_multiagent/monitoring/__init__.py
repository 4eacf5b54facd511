"""Monitoring: per-role metrics of each generation batch and alarms on the drift signatures the paper reports."""

from .drift import DriftAlarm, DriftThresholds, RoleDriftCallback
from .workflow_metrics import workflow_metrics

__all__ = ["DriftAlarm", "DriftThresholds", "RoleDriftCallback", "workflow_metrics"]
