"""Declines, lead times and false alarms as scripts/alarm_lead.py judges alarms by them."""

import math

import pytest

from trl_multiagent.evaluation.alarm_lead import (
    binomial_interval,
    decline_onset,
    poisson_interval,
    rebound_alarms,
    score_run,
)


def steps(values):
    return list(enumerate(values, start=1))


def test_a_sustained_fall_is_a_decline_starting_where_the_running_mean_crosses():
    success = [0.7] * 30 + [0.3] * 30
    # The running mean of 10 steps is 0.7 up to step 30, then falls by 0.04 a step: 0.7 - 0.15 is crossed at step 34.
    assert decline_onset(steps(success), window=10, drop=0.15, hold=10) == 34


def test_a_flat_run_and_a_short_dip_are_not_declines():
    assert decline_onset(steps([0.6] * 60)) is None
    dip = [0.7] * 30 + [0.2] * 6 + [0.7] * 30  # the running mean is back above the line within 10 steps
    assert decline_onset(steps(dip), window=10, drop=0.15, hold=10) is None


def test_a_fall_at_the_very_end_is_not_called_a_decline_without_its_hold():
    success = [0.7] * 50 + [0.2] * 8
    assert decline_onset(steps(success), window=10, drop=0.15, hold=10) is None


def test_a_warning_counts_inside_the_horizon_and_is_false_before_it():
    score = score_run([10, 50, 62, 90], onset=70, last_step=100, horizon=30)
    assert score.lead == 20  # the alarm at 50, the first in [40, 70)
    assert score.false_alarms == 1  # the alarm at 10; the one at 90 comes after the fall shows
    assert score.steps_watched == 39


def test_every_alarm_of_a_run_without_a_decline_is_false():
    score = score_run([5, 20], onset=None, last_step=40)
    assert (score.lead, score.false_alarms, score.steps_watched) == (None, 2, 40)


def test_exact_intervals_match_their_closed_forms():
    # 0 of n: the upper bound solves (1 - p)^n = 0.025; n of n: the lower bound solves p^n = 0.025.
    assert binomial_interval(0, 5) == pytest.approx((0.0, 1 - 0.025 ** (1 / 5)))
    assert binomial_interval(3, 3) == pytest.approx((0.025 ** (1 / 3), 1.0))
    # No events in 1,000 steps: the upper bound of the mean is -ln(0.025).
    assert poisson_interval(0, 1000) == pytest.approx((0.0, -math.log(0.025)))
    low, high = poisson_interval(3, 1000)
    assert low < 3 < high


def test_bad_counts_are_refused():
    with pytest.raises(ValueError, match="successes <= trials"):
        binomial_interval(4, 3)
    with pytest.raises(ValueError, match="exposure > 0"):
        poisson_interval(1, 0)


def test_the_entropy_rebound_fires_once_when_entropy_comes_back_up_from_its_lowest():
    entropy = [0.10] * 10 + [0.05] * 20 + [0.09] * 20
    alarms = rebound_alarms(steps(entropy), window=10, factor=1.6)
    # The lowest running mean is 0.05; it passes 0.08 once 8 of the last 10 steps are at 0.09: step 38.
    assert alarms == [38]


def test_the_entropy_rebound_stays_quiet_on_a_flat_or_falling_entropy():
    assert rebound_alarms(steps([0.07] * 60), window=10, factor=1.2) == []
    assert rebound_alarms(steps([0.1 - 0.001 * i for i in range(60)]), window=10, factor=1.2) == []
