"""Confidence intervals for speedups and ratios: bootstrap over the repetitions (scipy.stats.bootstrap)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

RESAMPLES = 2000


def _finite(values: Sequence[float]) -> np.ndarray:
    """The finite values of ``values`` (None and NaN dropped), as float64."""
    return np.asarray([x for x in values if x is not None and math.isfinite(x)], float)


def ratio_ci(numerator: Sequence[float], denominator: Sequence[float], level: float = 0.95,
             seed: int = 0) -> tuple[float, float, float]:
    """(median(numerator) / median(denominator), low, high): the ratio of medians with a percentile
    bootstrap interval, both samples resampled independently. A speedup of B over A is
    ``ratio_ci(times_A, times_B)``. With fewer than 2 values on a side the interval is (nan, nan)."""
    from scipy.stats import bootstrap

    a, b = _finite(numerator), _finite(denominator)
    if len(a) == 0 or len(b) == 0:
        return float("nan"), float("nan"), float("nan")
    point = float(np.median(a) / np.median(b))
    if len(a) < 2 or len(b) < 2 or (np.ptp(a) == 0 and np.ptp(b) == 0):
        return point, float("nan"), float("nan")

    def stat(x, y, axis=-1):
        return np.median(x, axis=axis) / np.median(y, axis=axis)

    res = bootstrap((a, b), stat, n_resamples=RESAMPLES, confidence_level=level, method="percentile",
                    vectorized=True, paired=False, random_state=np.random.default_rng(seed))
    return point, float(res.confidence_interval.low), float(res.confidence_interval.high)


def fmt_ci(point: float, low: float, high: float, digits: int = 2) -> str:
    """``1.42 [1.31, 1.55]``, or the point alone where there is no interval."""
    if not math.isfinite(point):
        return "n/a"
    if not (math.isfinite(low) and math.isfinite(high)):
        return f"{point:.{digits}f}"
    return f"{point:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def median_ci(values: Sequence[float], level: float = 0.95, seed: int = 0) -> tuple[float, float, float]:
    """(median, low, high): the median of ``values`` with a percentile bootstrap interval; with fewer than 2
    values, or all equal, the interval is (nan, nan)."""
    from scipy.stats import bootstrap

    a = _finite(values)
    if len(a) == 0:
        return float("nan"), float("nan"), float("nan")
    point = float(np.median(a))
    if len(a) < 2 or np.ptp(a) == 0:
        return point, float("nan"), float("nan")
    res = bootstrap((a,), np.median, n_resamples=RESAMPLES, confidence_level=level, method="percentile",
                    vectorized=True, random_state=np.random.default_rng(seed))
    return point, float(res.confidence_interval.low), float(res.confidence_interval.high)
