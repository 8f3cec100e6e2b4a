"""Interval coverage by simulation: synthetic studies with a known answer (metrics.coverage), 2, 3
and 5 repeats, a run effect between repeats and correlated requests inside each.

With 1,000 studies a 95 % method's coverage has a standard error of 0.7 points, so [0.93, 0.97]
holds a correct method (at 3 standard errors) and rejects one that is 2.5 points off or more.
The percentile bootstrap over repeats, which headline.csv used before the t interval, is shown to
fail the same bound: the test can tell the two apart."""

from __future__ import annotations

import pytest

from prefixstudy.shared.bootstrap import t_quantile
from prefixstudy.metrics.coverage import coverage


@pytest.mark.parametrize("repeats", [2, 3, 5])
def test_the_interval_over_repeats_covers_the_machines_mean_95_percent_of_the_time(repeats):
    assert 0.93 <= coverage(repeats, 1000, seed=repeats) <= 0.97


@pytest.mark.slow
def test_the_percentile_bootstrap_over_two_repeats_does_not():
    assert coverage(2, 200, seed=2, method="percentile", n_boot=200) < 0.80


def test_t_quantiles():
    assert [round(t_quantile(0.975, df), 4) for df in (1, 2, 4, 30)] == [12.7062, 4.3027, 2.7764, 2.0423]
