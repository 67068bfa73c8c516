"""Student's t quantiles and the interval of a mean over runs, against scipy."""

from __future__ import annotations

import math

import pytest

from somatize.torch.intervals import mean_interval, t_quantile, welch_df

stats = pytest.importorskip("scipy.stats")


@pytest.mark.parametrize("df", [0.5, 1, 2, 2.5, 4, 9, 30, 1000, 1e5])
def test_t_quantiles_are_scipy_s(df):
    for p in (0.6, 0.8, 0.9, 0.975, 0.995, 0.9995, 0.025):
        want = stats.t.ppf(p, df)
        assert t_quantile(p, df) == pytest.approx(want, rel=1e-9, abs=1e-9)


def test_the_interval_of_a_mean_is_scipy_s_and_wider_than_two_standard_errors():
    values = [0.9749, 0.9748, 0.9664, 0.9778, 0.9690]
    low, high = mean_interval(values)
    mean, se = sum(values) / 5, stats.sem(values)
    want = stats.t.interval(0.95, 4, loc=mean, scale=se)
    assert (low, high) == (pytest.approx(want[0], abs=1e-12), pytest.approx(want[1], abs=1e-12))
    assert high - mean == pytest.approx(2.7764451 * se)  # not 2 standard errors
    assert all(math.isnan(v) for v in mean_interval([0.97]))


def test_welch_degrees_of_freedom_are_scipy_s():
    a, b = [0.1, 0.3, 0.2, 0.25], [0.5, 0.52, 0.49]
    test = stats.ttest_ind(a, b, equal_var=False)
    sa, sb = stats.tstd(a), stats.tstd(b)
    assert welch_df(sa, 4, sb, 3) == pytest.approx(test.df)
    assert math.isnan(welch_df(0.0, 3, 0.0, 3))


def test_a_probability_out_of_range_is_refused():
    with pytest.raises(ValueError, match="0 < p < 1 and df > 0"):
        t_quantile(1.0, 3)
