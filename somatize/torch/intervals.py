"""Confidence intervals over a few runs: Student's t, not the normal's 2 standard errors.

Five seeds give a mean with 4 degrees of freedom, whose 95% interval is ±2.78 standard
errors (three seeds: ±4.30); ±2 would claim about 88% (82%). ``t_quantile`` computes the
quantile from the regularized incomplete beta function (a continued fraction, as
Numerical Recipes' ``betacf``), so somatize needs no scipy; it agrees with
``scipy.stats.t.ppf`` to 1e-9 (tests/torch/test_intervals.py). ``compare`` and ``summarize``
use it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

__all__ = ["mean_interval", "t_quantile", "welch_df"]


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (``df`` > 0, not
    necessarily whole: Welch's).

    Example:
        >>> round(t_quantile(0.975, 4), 4)
        2.7764
    """
    if not 0 < p < 1 or not df > 0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df > 0, not p={p!r}, df={df!r}")
    if p < 0.5:
        return -t_quantile(1 - p, df)
    if p == 0.5:
        return 0.0
    low, high = 0.0, 1.0
    while _cdf(high, df) < p:  # (a bracket: 1e12 at most for df >= 0.1 and p < 1 - 1e-12)
        high *= 2
    for _ in range(200):  # bisection to the float's resolution
        mid = (low + high) / 2
        if mid in (low, high):
            break
        low, high = (mid, high) if _cdf(mid, df) < p else (low, mid)
    return (low + high) / 2


def welch_df(s1: float, n1: int, s2: float, n2: int) -> float:
    """Welch–Satterthwaite degrees of freedom of a difference of two means (sample standard
    deviations ``s1``, ``s2`` over ``n1``, ``n2`` runs); NaN when both spreads are 0."""
    a, b = s1 * s1 / n1, s2 * s2 / n2
    if a + b == 0:
        return math.nan
    return (a + b) ** 2 / (a * a / (n1 - 1) + b * b / (n2 - 1))


def mean_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """The ``level`` confidence interval of the mean of ``values`` (independent runs), by
    Student's t with n - 1 degrees of freedom; (NaN, NaN) for fewer than two values.

    Example:
        >>> low, high = mean_interval([0.97, 0.975, 0.968, 0.972, 0.98])
        >>> round(low, 4), round(high, 4)
        (0.9672, 0.9788)
    """
    n = len(values)
    if n < 2:
        return math.nan, math.nan
    mean = statistics.fmean(values)
    half = t_quantile(0.5 + level / 2, n - 1) * statistics.stdev(values) / math.sqrt(n)
    return mean - half, mean + half


def _cdf(t: float, df: float) -> float:
    """P(T <= t) for t >= 0."""
    return 1 - 0.5 * _beta_inc(df / 2, 0.5, df / (df + t * t))


def _beta_inc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1) / (a + b + 2):
        return front * _fraction(a, b, x) / a
    return 1 - front * _fraction(b, a, 1 - x) / b


def _fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of I_x(a, b), by Lentz's method."""
    tiny = 1e-300
    c, d = 1.0, 1 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1 + num * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return h
