"""Per-role instability summaries from a run's logged metrics (``role/<role>/<metric>`` in ``log_history``).

The paper tracks, per role, the policy ratio between training and rollout policy (and its chi-square), the gradient
norm, and how deep entropy collapses. A metric a run did not log is left out of its summary.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

_ROLE_METRIC = re.compile(r"^role/(?P<role>[^/]+)/(?P<metric>.+)$")
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def read_log_history(run_dir: str | Path) -> list[dict[str, Any]]:
    """The ``log_history`` of the most advanced ``trainer_state.json`` in ``run_dir`` or its checkpoints."""
    run_dir = Path(run_dir)
    candidates = [run_dir / "trainer_state.json"]
    candidates += [p / "trainer_state.json" for p in run_dir.glob("checkpoint-*") if _CHECKPOINT.match(p.name)]
    states = [json.loads(path.read_text()) for path in candidates if path.is_file()]
    if not states:
        return []
    return max(states, key=lambda state: state.get("global_step", 0)).get("log_history", [])


def role_series(log_history: list[dict[str, Any]], metric: str) -> dict[str, list[tuple[int, float]]]:
    """Role -> ``[(step, value), ...]`` of ``role/<role>/<metric>``, in logging order."""
    series: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for entry in log_history:
        for name, value in entry.items():
            match = _ROLE_METRIC.match(name)
            if match and match["metric"] == metric and isinstance(value, int | float):
                series[match["role"]].append((entry.get("step", 0), float(value)))
    return dict(series)


def role_instability(log_history: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Role -> summary: the max (and its step) of the policy ratio, its chi-square and the gradient norm; the policy
    ratio's growth over its first value; entropy first, minimum, last, collapse depth (first minus minimum) and change
    (last minus first)."""
    summary: dict[str, dict[str, float]] = defaultdict(dict)
    for metric in ("policy_ratio", "chi_square", "grad_norm"):
        for role, points in role_series(log_history, metric).items():
            step, peak = max(points, key=lambda point: point[1])
            summary[role][f"{metric}_max"], summary[role][f"{metric}_max_step"] = peak, step
            if metric == "policy_ratio" and points[0][1]:
                summary[role]["policy_ratio_growth"] = peak / points[0][1]
    for role, points in role_series(log_history, "entropy").items():
        values = [value for _, value in points]
        summary[role].update(
            entropy_first=values[0],
            entropy_min=min(values),
            entropy_last=values[-1],
            entropy_collapse=values[0] - min(values),
            entropy_change=values[-1] - values[0],
        )
    return dict(summary)
