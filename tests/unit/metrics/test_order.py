"""metrics.order: which arm went first, read from the points' start times, and the gain by order."""

from __future__ import annotations

import pandas as pd
import pytest

from prefixstudy.metrics.order import first_arms, order_effect, spread

# rate 4: repeat 0 OFF first, repeat 1 ON first, repeat 2 OFF first; rate 8 likewise but ON saturated
# once; rate 2: ON first in every repeat (one order: not comparable).
STARTS = {(4.0, 0): ("off", "on"), (4.0, 1): ("on", "off"), (4.0, 2): ("off", "on"),
          (8.0, 0): ("off", "on"), (8.0, 1): ("on", "off"), (2.0, 0): ("on", "off"), (2.0, 1): ("on", "off")}
E2E = {("on", 4.0, 0): 80.0, ("off", 4.0, 0): 100.0, ("on", 4.0, 1): 90.0, ("off", 4.0, 1): 100.0,
       ("on", 4.0, 2): 70.0, ("off", 4.0, 2): 100.0, ("on", 8.0, 0): 50.0, ("off", 8.0, 0): 100.0,
       ("on", 8.0, 1): 60.0, ("off", 8.0, 1): 100.0, ("on", 2.0, 0): 50.0, ("off", 2.0, 0): 60.0,
       ("on", 2.0, 1): 50.0, ("off", 2.0, 1): 60.0}


def _points():
    t, out = 0.0, []
    for (rate, k), order in STARTS.items():
        for m in order:
            out.append({"mode": m, "rate": rate, "repeat": k, "started_at": t})
            t += 10.0
    return out[::-1]  # the manifest's order is not the run's: the start times decide


def _summary():
    return pd.DataFrame([{"mode": m, "rate": r, "repeat": k, "mean_e2e_ms": v,
                          "saturated": (m, r, k) == ("on", 8.0, 1)} for (m, r, k), v in E2E.items()])


def test_first_arms_come_from_the_start_times():
    f = first_arms(_points())
    assert f.to_dict("records") == [
        {"rate": 2.0, "repeat": 0, "first": "on"}, {"rate": 2.0, "repeat": 1, "first": "on"},
        {"rate": 4.0, "repeat": 0, "first": "off"}, {"rate": 4.0, "repeat": 1, "first": "on"},
        {"rate": 4.0, "repeat": 2, "first": "off"}, {"rate": 8.0, "repeat": 0, "first": "off"},
        {"rate": 8.0, "repeat": 1, "first": "on"}]


def test_the_gain_by_order_at_the_calm_rates_with_both_orders():
    e = order_effect(_points(), _summary(), "on", "off")
    assert e["rate"].tolist() == [4.0]  # 2: one order only; 8: ON saturated in a repeat
    r = e.iloc[0]
    assert (r["n_baseline_first"], r["n_arm_first"]) == (2, 1)
    assert r["gain_baseline_first"] == pytest.approx(0.25)  # (0.2 + 0.3) / 2
    assert r["gain_arm_first"] == pytest.approx(0.10)
    assert r["difference_points"] == pytest.approx(-15.0)
    assert r["arm_first_over_second"] == pytest.approx(90.0 / 75.0 - 1)
    assert r["baseline_first_over_second"] == pytest.approx(0.0)
    assert spread(e) == pytest.approx((-15.0, -15.0, -15.0))


def test_no_comparison_without_both_arms_or_start_times():
    assert order_effect(_points(), _summary(), "on+offload", "off").empty
    assert order_effect([], _summary(), "on", "off").empty
