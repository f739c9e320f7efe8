"""Intervals across seeds: the mean of n per-seed values with a Student-t interval.

With n independent seeds x_1..x_n, mean m and sample standard deviation s, the two-sided interval
at ``level`` is m +- t_{(1+level)/2, n-1} s / sqrt(n) (Student 1908; ``scipy.stats.t``). It assumes
the per-seed values are roughly normal, which three to five seeds cannot check: read it as the
usual small-sample summary, and compare an effect with the replicate and seed arms' intervals, not
with zero. One seed gives no interval (NaN bounds); non-finite values are left out and counted.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

LEVEL = 0.95


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float
    high: float
    n: int

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2


def t_interval(values, level: float = LEVEL) -> Interval:
    """Mean and Student-t interval of the finite ``values`` (see the module docstring)."""
    from scipy import stats

    x = np.asarray([v for v in values if v is not None], dtype=np.float64)
    x = x[np.isfinite(x)]
    n = len(x)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    mean = float(x.mean())
    if n == 1:
        return Interval(mean, math.nan, math.nan, 1)
    half = float(stats.t.ppf((1 + level) / 2, n - 1) * x.std(ddof=1) / math.sqrt(n))
    return Interval(mean, mean - half, mean + half, n)


def interval_columns(prefix: str, values, level: float = LEVEL) -> dict[str, float]:
    """``<prefix>_mean``, ``<prefix>_ci_low``, ``<prefix>_ci_high`` and ``<prefix>_n`` for a table row."""
    ci = t_interval(values, level)
    return {f"{prefix}_mean": ci.mean, f"{prefix}_ci_low": ci.low, f"{prefix}_ci_high": ci.high, f"{prefix}_n": ci.n}
