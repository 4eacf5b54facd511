"""Percentile bootstrap over problems: the intervals of attribution shares and of the grid's residuals.

A table holds one row per evaluated variant and one column per problem (the same problems, in the same order, in
every row). Each resampling draws ``n`` problems with replacement and keeps a drawn problem's outcome in every row,
so comparisons between rows stay paired; the interval is the central ``confidence`` percentiles of the statistic
over the resamplings.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

Statistic = Callable[[np.ndarray], dict[str, float]]  # [rows, problems] -> named numbers


def bootstrap_over_problems(
    table: np.ndarray | Sequence[Sequence[float]],
    statistic: Statistic,
    *,
    bootstrap: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict[str, dict[str, float]]:
    """Each number ``statistic`` returns on ``table``, with its percentile interval over ``bootstrap`` resamplings
    of the problems (columns): ``{name: {"value", "low", "high"}}``; without resamplings the bounds are NaN."""
    table = np.asarray(table, dtype=float)
    if table.ndim != 2 or table.shape[1] == 0:
        raise ValueError("Every row needs the same, non-zero number of per-problem outcomes.")
    point = statistic(table)
    rng = np.random.default_rng(seed)
    n = table.shape[1]
    draws = [statistic(table[:, rng.integers(0, n, n)]) for _ in range(bootstrap)]
    tail = 100 * (1 - confidence) / 2
    intervals = {}
    for name, value in point.items():
        samples = [draw[name] for draw in draws]
        low, high = np.percentile(samples, [tail, 100 - tail]) if samples else (math.nan, math.nan)
        intervals[name] = {"value": float(value), "low": float(low), "high": float(high)}
    return intervals


def paired_difference(
    first: Sequence[float],
    second: Sequence[float],
    *,
    bootstrap: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict[str, float]:
    """Mean of ``first`` minus mean of ``second`` (per-problem outcomes of the same problems) with its paired
    percentile interval: ``{"value", "low", "high"}``."""
    if len(first) != len(second):
        raise ValueError(
            f"A paired difference needs the same problems on both sides; got {len(first)} and {len(second)} "
            "outcomes (evaluate both with the same dataset and --limit)."
        )
    table = np.array([first, second], dtype=float)
    return bootstrap_over_problems(
        table,
        lambda columns: {"difference": columns[0].mean() - columns[1].mean()},
        bootstrap=bootstrap,
        confidence=confidence,
        seed=seed,
    )["difference"]
