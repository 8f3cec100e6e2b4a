import numpy as np

from prefixstudy.runner.arrivals import schedule


def test_constant_is_exact():
    assert schedule(4, 2.0, "constant").tolist() == [0.0, 0.5, 1.0, 1.5]


def test_same_rate_same_schedule_for_every_mode():
    a = schedule(100, 4.0, "poisson", seed=3)
    b = schedule(100, 4.0, "poisson", seed=3)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, schedule(100, 8.0, "poisson", seed=3))


def test_poisson_gaps_have_mean_one_over_rate():
    s = schedule(20001, 5.0, "poisson", seed=0)
    gaps = np.diff(s)
    assert s[0] == 0.0 and (gaps > 0).all()
    assert abs(gaps.mean() - 0.2) < 0.005  # 20000 gaps: standard error 0.0014


def test_gamma_burstiness_keeps_mean_and_changes_spread():
    bursty = np.diff(schedule(20001, 5.0, "gamma", burstiness=0.25, seed=0))
    smooth = np.diff(schedule(20001, 5.0, "gamma", burstiness=4.0, seed=0))
    assert abs(bursty.mean() - 0.2) < 0.01 and abs(smooth.mean() - 0.2) < 0.005
    # Coefficient of variation of a gamma gap is 1/sqrt(shape): 2.0 and 0.5.
    assert abs(bursty.std() / bursty.mean() - 2.0) < 0.1
    assert abs(smooth.std() / smooth.mean() - 0.5) < 0.02
