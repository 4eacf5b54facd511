"""Whether an alarm warns before a run's success falls: declines, lead times and false alarms, as pure functions.

- `decline_onset`: a run declines when the running mean of its per-step success falls ``drop`` below its best so far
  and stays there for ``hold`` steps; the onset is the first step of that stretch.
- `score_run`: an alarm warns a decline when it fires within ``horizon`` steps before the onset; its lead time is
  the onset minus the first such alarm's step. Every other alarm (in a run that does not decline, or more than
  ``horizon`` steps before the onset) is a false alarm; alarms after the onset are neither (the fall shows already).
- `binomial_interval` / `poisson_interval`: exact 95% intervals for the share of declines warned and for the false
  alarms per 1,000 steps (the counts are small, so normal approximations would mislead).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .mechanisms import running_mean


def decline_onset(
    points: Sequence[tuple[int, float]], *, window: int = 10, drop: float = 0.15, hold: int = 10
) -> int | None:
    """The step a decline starts, or None: the first step whose running mean of ``window`` steps of success lies
    ``drop`` below the best running mean before it and stays below that line for ``hold`` steps (this one included).
    The running mean counts only once it spans ``window`` steps."""
    if window < 1 or hold < 1 or drop <= 0:
        raise ValueError("decline_onset needs window >= 1, hold >= 1 and drop > 0 (e.g. 10, 10, 0.15).")
    steps = [step for step, _ in points]
    smooth = running_mean([value for _, value in points], window)
    best = -math.inf
    for i in range(window - 1, len(smooth)):
        stretch = smooth[i : i + hold]
        if best > -math.inf and len(stretch) == hold and max(stretch) < best - drop:
            return steps[i]
        best = max(best, smooth[i])
    return None


@dataclass(frozen=True)
class RunScore:
    """How one run's alarms did: whether and how early they warned its decline, and how many were false."""

    onset: int | None  # the decline's first step; None when the run does not decline
    lead: int | None  # onset minus the first warning's step; None when nothing warned (or no decline)
    false_alarms: int
    steps_watched: int  # the steps in which a false alarm could have fired


def score_run(alarms: Sequence[int], *, onset: int | None, last_step: int, horizon: int = 40) -> RunScore:
    """Score the steps at which an alarm fired in one run of ``last_step`` steps against its decline's ``onset``.

    A warning is an alarm in ``[onset - horizon, onset)``; alarms before that window are false (an alarm that fires
    long before the fall warns of nothing a user could act on), and so is every alarm of a run without a decline.
    The steps watched for false alarms are the run's steps, up to ``onset - horizon`` in a declining run."""
    if onset is None:
        return RunScore(None, None, len(alarms), last_step)
    start = onset - horizon
    warnings = [step for step in alarms if start <= step < onset]
    return RunScore(
        onset=onset,
        lead=onset - min(warnings) if warnings else None,
        false_alarms=sum(step < start for step in alarms),
        steps_watched=max(start - 1, 0),
    )


def _bisect(f, low: float, high: float) -> float:
    """The root of an increasing ``f`` on ``[low, high]``."""
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if f(mid) < 0 else (low, mid)
    return (low + high) / 2


def _binomial_cdf(k: int, n: int, p: float) -> float:
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k + 1))


def binomial_interval(successes: int, trials: int, level: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper-Pearson) interval of a proportion: ``successes`` of ``trials``."""
    if not 0 <= successes <= trials or trials < 1:
        raise ValueError(f"binomial_interval needs 0 <= successes <= trials >= 1, got {successes} of {trials}.")
    tail = (1 - level) / 2
    low = 0.0 if successes == 0 else _bisect(lambda p: 1 - _binomial_cdf(successes - 1, trials, p) - tail, 0, 1)
    high = 1.0 if successes == trials else _bisect(lambda p: tail - _binomial_cdf(successes, trials, p), 0, 1)
    return low, high


def _poisson_cdf(k: int, mean: float) -> float:
    return sum(math.exp(-mean + i * math.log(mean) - math.lgamma(i + 1)) for i in range(k + 1)) if mean > 0 else 1.0


def poisson_interval(count: int, exposure: float, level: float = 0.95, per: float = 1000.0) -> tuple[float, float]:
    """The exact interval of a Poisson rate, ``count`` events over ``exposure`` steps, per ``per`` steps."""
    if count < 0 or exposure <= 0:
        raise ValueError(f"poisson_interval needs count >= 0 and exposure > 0, got {count} over {exposure}.")
    tail = (1 - level) / 2
    top = 10.0 * (count + 10)
    low = 0.0 if count == 0 else _bisect(lambda m: 1 - _poisson_cdf(count - 1, m) - tail, 0, top)
    high = _bisect(lambda m: tail - _poisson_cdf(count, m), 0, top)
    return low * per / exposure, high * per / exposure


def rebound(points: Sequence[tuple[int, float]], *, window: int) -> list[tuple[int, float]]:
    """``[(step, ratio), ...]``: the running mean of ``window`` steps over its lowest value so far, from the first
    step it spans ``window`` steps. A role's entropy first falls as its policy sharpens; the ratio says how far it
    has come back up since, which a comparison with the first steps' value (``entropy_rise``) cannot see."""
    steps = [step for step, _ in points]
    smooth = running_mean([value for _, value in points], window)
    ratios, lowest = [], math.inf
    for step, value in zip(steps[window - 1 :], smooth[window - 1 :]):
        lowest = min(lowest, value)
        ratios.append((step, value / lowest if lowest > 0 else 1.0))
    return ratios


def rebound_alarms(points: Sequence[tuple[int, float]], *, window: int, factor: float) -> list[int]:
    """The steps at which the ``rebound`` ratio crosses above ``factor``; it alarms again only after falling back."""
    alarms, above = [], False
    for step, ratio in rebound(points, window=window):
        if ratio > factor and not above:
            alarms.append(step)
        above = ratio > factor
    return alarms
