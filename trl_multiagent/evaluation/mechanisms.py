"""The paper's two mechanisms, read from runs' logged metrics (`log_history` of `trainer_state.json`): pure functions.

- **Amplification** (isolated policy): how large each role's update is per training step, against the number of
  same-role instances and the update schedule: `role/<role>/update_ratio` and `update_chi_square`
  (`monitor_update_size`), the loss's own `policy_ratio` and `chi_square`, `grad_norm` before clipping (under
  `update_schedule="mini_batches"` over all of the step's updates of the role's adapter) and that norm per optimizer
  update (`per_update_grad_norm`).
- **Capture** (shared policy): each role's share of the shared adapter's squared gradient norm
  (`role/<role>/grad_norm_share`, logged with `monitor_role_grad_norms`) against its share of the step's outputs and
  of its completion tokens (`role_shares`); how fast success rises and where it peaks (`rise_and_peak`).

Seeds are summarised by their mean and a 95% Student-t interval (`seed_interval`), geometric for update sizes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

# Two-sided 95% quantiles of Student's t with 1-10 degrees of freedom (a seed count of 2 to 11).
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}
_ALARM = re.compile(r"^alarm/(?P<role>[^/]+)/(?P<kind>.+)$")


def step_series(log_history: list[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    """`[(step, value), ...]` of every logged entry holding a finite ``key``, in logging order."""
    return [
        (entry.get("step", 0), float(entry[key]))
        for entry in log_history
        if isinstance(entry.get(key), int | float) and math.isfinite(entry[key])
    ]


def mean_over_steps(log_history: list[dict[str, Any]], key: str) -> float | None:
    """The mean of ``key`` over the steps that logged it; None when none did."""
    values = [value for _, value in step_series(log_history, key)]
    return sum(values) / len(values) if values else None


def per_update_grad_norm(log_history: list[dict[str, Any]], role: str, adapter: str) -> list[tuple[int, float]]:
    """The role's gradient norm before clipping per optimizer update of its adapter: the step's `role/<role>/grad_norm`
    (the root of the sum of the squared norms of the step's updates) over the root of
    `adapter/<adapter>/optimizer_steps` (1 where not logged: `update_schedule="merged"`), the root mean square of the
    norms of its updates. For a role alone on its adapter (isolated policy)."""
    steps = dict(step_series(log_history, f"adapter/{adapter}/optimizer_steps"))
    return [
        (step, norm / math.sqrt(steps.get(step, 1.0) or 1.0))
        for step, norm in step_series(log_history, f"role/{role}/grad_norm")
    ]


def role_shares(log_history: list[dict[str, Any]], roles: Sequence[str]) -> list[dict[str, Any]]:
    """Per step and role: its share of the squared gradient norm (`gradient`, None on a step that logged no share),
    of the step's model calls (`outputs`) and of their completion tokens (`tokens`, calls times mean length)."""
    rows = []
    for entry in log_history:
        calls = {role: entry.get(f"role/{role}/calls") for role in roles}
        if any(not isinstance(value, int | float) for value in calls.values()) or not sum(calls.values()):
            continue  # not a step's log (the run's summary line), or a step without calls
        tokens = {role: calls[role] * entry.get(f"role/{role}/completion_length", 0.0) for role in roles}
        for role in roles:
            share = entry.get(f"role/{role}/grad_norm_share")
            rows.append(
                {
                    "step": entry.get("step", 0),
                    "role": role,
                    "gradient": float(share) if isinstance(share, int | float) and math.isfinite(share) else None,
                    "outputs": calls[role] / sum(calls.values()),
                    "tokens": tokens[role] / sum(tokens.values()) if sum(tokens.values()) else None,
                }
            )
    return rows


def running_mean(values: Sequence[float], window: int) -> list[float]:
    """The trailing mean of each value with up to ``window - 1`` values before it."""
    means = []
    for i in range(len(values)):
        recent = values[max(0, i + 1 - window) : i + 1]
        means.append(sum(recent) / len(recent))
    return means


def rise_and_peak(points: Sequence[tuple[int, float]], *, window: int) -> dict[str, float]:
    """How a per-step series (success) rises, from its trailing running mean over ``window`` steps: `start` (the mean
    of the first ``window`` steps), `peak` and `peak_step` (the running mean's maximum, first step it is reached),
    `half_rise_step` (the first step whose running mean covers half of peak minus start), `final` (the last running
    mean) and `decline` (peak minus final)."""
    if len(points) < window:
        raise ValueError(f"rise_and_peak needs at least window={window} steps, got {len(points)}.")
    steps = [step for step, _ in points]
    smooth = running_mean([value for _, value in points], window)
    start = smooth[window - 1]
    peak = max(smooth[window - 1 :])
    peak_at = steps[smooth.index(peak, window - 1)]
    half = start + (peak - start) / 2
    half_at = next(step for step, value in zip(steps[window - 1 :], smooth[window - 1 :]) if value >= half)
    return {
        "start": start,
        "peak": peak,
        "peak_step": float(peak_at),
        "half_rise_step": float(half_at),
        "final": smooth[-1],
        "decline": peak - smooth[-1],
    }


def alarm_steps(log_history: list[dict[str, Any]]) -> list[tuple[int, str, str]]:
    """`[(step, role, kind), ...]` of every drift alarm the run logged (`alarm/<role>/<kind>`)."""
    return [
        (entry.get("step", 0), match["role"], match["kind"])
        for entry in log_history
        for key in entry
        if (match := _ALARM.match(key))
    ]


def seed_interval(values: Sequence[float], *, log: bool = False) -> tuple[float, float, float]:
    """(mean, low, high): the mean over seeds and its 95% Student-t interval; with one seed, no interval (NaN).

    ``log=True`` for a positive quantity spread over orders of magnitude (a chi-square): the geometric mean and its
    interval, the t interval of the logarithms taken back (a factor either side); all zero gives (0, 0, 0).
    """
    n = len(values)
    if not n:
        raise ValueError("seed_interval needs at least one value.")
    if log:
        if all(v == 0 for v in values):
            return 0.0, 0.0, 0.0
        if any(v <= 0 for v in values):
            raise ValueError(f"seed_interval(log=True) needs positive values, got {list(values)}.")
        mean, low, high = seed_interval([math.log(v) for v in values])
        return math.exp(mean), math.exp(low), math.exp(high)
    mean = sum(values) / n
    if n == 1:
        return mean, math.nan, math.nan
    if n - 1 not in _T95:
        raise ValueError(f"seed_interval knows the t quantiles of 2 to {max(_T95) + 1} seeds, got {n}.")
    half = _T95[n - 1] * math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)
    return mean, mean - half, mean + half
