"""Reading the paper's two mechanisms from logged metrics: update sizes per optimizer update, role shares of a shared
adapter's gradient against outputs and tokens, the rise and peak of success, alarms, intervals over seeds."""

from __future__ import annotations

import math

import pytest

from trl_multiagent.evaluation.mechanisms import (
    alarm_steps,
    mean_over_steps,
    per_update_grad_norm,
    rise_and_peak,
    role_shares,
    running_mean,
    seed_interval,
    step_series,
)


def test_series_skip_entries_without_a_finite_value():
    history = [{"step": 1, "x": 2.0}, {"step": 2, "x": float("nan")}, {"step": 3}, {"step": 4, "x": 4}]
    assert step_series(history, "x") == [(1, 2.0), (4, 4.0)]
    assert mean_over_steps(history, "x") == 3.0
    assert mean_over_steps(history, "y") is None


def test_per_update_norm_divides_by_the_root_of_the_updates():
    """Three mini-batch updates of norm 2 each log a step norm of sqrt(12); per update that is 2 again. A merged
    run logs no optimizer_steps: one update."""
    mini = [{"step": 1, "role/generator/grad_norm": math.sqrt(12.0), "adapter/generator/optimizer_steps": 3.0}]
    assert per_update_grad_norm(mini, "generator", "generator") == [(1, pytest.approx(2.0))]
    merged = [{"step": 1, "role/generator/grad_norm": 2.0}]
    assert per_update_grad_norm(merged, "generator", "generator") == [(1, 2.0)]


def test_role_shares_of_gradient_outputs_and_tokens():
    history = [
        {
            "step": 1,
            "role/generator/calls": 96.0,
            "role/aggregator/calls": 32.0,
            "role/generator/completion_length": 10.0,
            "role/aggregator/completion_length": 30.0,
            "role/generator/grad_norm_share": 0.8,
            "role/aggregator/grad_norm_share": 0.2,
        },
        {"step": 2, "role/generator/calls": 96.0, "role/aggregator/calls": 32.0},  # no gradient share logged
        {"step": 2, "train_runtime": 10.0},  # the summary line
    ]
    rows = role_shares(history, ["generator", "aggregator"])
    first = {row["role"]: row for row in rows if row["step"] == 1}
    assert first["generator"]["outputs"] == 0.75 and first["aggregator"]["outputs"] == 0.25
    assert first["generator"]["tokens"] == 0.5 and first["aggregator"]["tokens"] == 0.5  # 960 and 960 tokens
    assert first["generator"]["gradient"] == 0.8
    second = [row for row in rows if row["step"] == 2]
    assert len(second) == 2 and all(row["gradient"] is None for row in second)


def test_running_mean_and_the_rise():
    assert running_mean([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    success = [0.5, 0.5, 0.6, 0.7, 0.8, 0.9, 0.9, 0.7, 0.6]
    summary = rise_and_peak(list(enumerate(success, start=1)), window=2)
    assert summary["start"] == 0.5 and summary["peak"] == pytest.approx(0.9)
    assert summary["peak_step"] == 7  # the running mean of steps 6-7
    assert summary["half_rise_step"] == 5  # (0.7 + 0.8) / 2 first covers half of 0.5 -> 0.9
    assert summary["final"] == pytest.approx(0.65) and summary["decline"] == pytest.approx(0.25)
    with pytest.raises(ValueError, match="at least window=5"):
        rise_and_peak([(1, 0.5)], window=5)


def test_alarms_are_read_with_their_step_role_and_kind():
    history = [{"step": 3, "alarm/aggregator/entropy_rise": 1.0, "loss": 0.1}, {"step": 5}]
    assert alarm_steps(history) == [(3, "aggregator", "entropy_rise")]


def test_seed_interval_is_a_student_t_interval():
    mean, low, high = seed_interval([1.0, 2.0, 3.0])
    assert mean == 2.0
    assert high - mean == pytest.approx(4.303 * 1.0 / math.sqrt(3))  # sd 1, 2 degrees of freedom
    assert low == pytest.approx(2 * mean - high)
    one = seed_interval([4.0])
    assert one[0] == 4.0 and math.isnan(one[1]) and math.isnan(one[2])
    with pytest.raises(ValueError, match="2 to 11 seeds"):
        seed_interval([1.0] * 12)


def test_geometric_seed_interval_for_sizes_over_orders_of_magnitude():
    mean, low, high = seed_interval([0.001, 0.01, 0.1], log=True)
    assert mean == pytest.approx(0.01)
    assert high / mean == pytest.approx(mean / low)  # a factor either side
    assert high / mean == pytest.approx(10 ** (4.303 * 1.0 / math.sqrt(3)))  # sd of log10 is 1
    assert seed_interval([0.0, 0.0], log=True) == (0.0, 0.0, 0.0)  # the loss's chi-square under one update
    with pytest.raises(ValueError, match="positive values"):
        seed_interval([0.0, 0.1], log=True)
