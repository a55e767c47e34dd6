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


def median_order_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float, float]:
    """(median, low, high, coverage): the exact distribution-free interval of a median from order statistics.

    With the values sorted, x_(1) <= ... <= x_(n), the interval [x_(l), x_(n+1-l)] covers the population median with
    probability P(l <= B <= n - l), B ~ Binomial(n, 1/2) (each value falls below the median with probability
    1/2): the largest l whose coverage is still >= ``level``. ``coverage`` is that exact probability. Values may be
    ``inf`` (a run censored at its budget counts as larger than every finished one), so the bounds can be ``inf``.
    With n too small for ``level`` (n <= 5 at 95%) the interval is the range [x_(1), x_(n)] and ``coverage`` says
    what it really is (1 - 2^(1-n): 0.94 for 5, 0.75 for 3)."""
    from scipy.stats import binom

    x = np.sort(np.asarray([v for v in values if v is not None and not math.isnan(v)], float))
    n = len(x)
    if n == 0:
        return float("nan"), float("nan"), float("nan"), float("nan")
    med = float(np.median(x)) if not np.isinf(x[(n - 1) // 2:n // 2 + 1]).any() else float(x[n // 2])
    best = 1
    for lo in range(1, n // 2 + 1):
        cover = binom.cdf(n - lo, n, 0.5) - binom.cdf(lo - 1, n, 0.5)
        if cover >= level:
            best = lo
        else:
            break
    cover = float(binom.cdf(n - best, n, 0.5) - binom.cdf(best - 1, n, 0.5))
    return med, float(x[best - 1]), float(x[n - best]), cover


def pairing_range(numerator: Sequence[float], denominator: Sequence[float]) -> tuple[float, float]:
    """(min, max) of a_i / b_j over every pairing of a value of ``numerator`` with one of ``denominator``: how far a
    ratio of two contestants can go with these seeds, whatever the pairing."""
    a, b = np.asarray(numerator, float), np.asarray(denominator, float)
    if a.size == 0 or b.size == 0:
        return float("nan"), float("nan")
    with np.errstate(divide="ignore", invalid="ignore"):
        r = a[:, None] / b[None, :]
    return float(np.nanmin(r)), float(np.nanmax(r))
