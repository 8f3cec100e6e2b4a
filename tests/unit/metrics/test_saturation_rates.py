"""The saturation detector's error rates (benchmarks/saturation_error_rates.py): the committed
measurement meets the targets and supports the trend test's window gate, and the file's points are
what this code gives (re-simulated on vLLM's scheduler, judged again).  The gate itself on
synthetic points with a known backlog: a long window at 1.05x capacity, a short one, a level one."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from prefixstudy.metrics import saturation
from prefixstudy.schema import typed_requests
from tests.scripts import load_script

rates = load_script("benchmarks/saturation_error_rates.py")


@pytest.fixture(scope="module")
def rows():
    return rates.read_rows()


def test_the_committed_measurement_meets_the_targets(rows):
    table = rates.rates(rows)
    assert rates.meets_targets(table) == []
    caps = {r["mode"]: r for r in rows if r["kind"] == "capacity"}
    assert set(caps) == {"on", "off"} and all(c["unfinished_at_end"] == 0 for c in caps.values())
    for length in rates.TARGET_LENGTHS:
        for mode in ("on", "off"):
            at = {r["load"]: r for r in table if r["length"] == length and r["mode"] == mode}
            assert sorted(at) == list(rates.LOADS)
            assert all(r["points"] >= 100 for r in at.values())  # enough for a 2 % rate to mean something
            assert at[0.8]["flagged"] <= 2 and at[1.1]["share"] >= 0.95


def test_the_trend_decides_from_the_window_length_where_it_meets_the_target(rows):
    # The trend test alone, as it decides where the limit is known, at each mode and load <= 0.8
    # of capacity: at most 2 % flagged on every window of at least MIN_TREND_WINDOW_S (pooled, with
    # 95 % confidence under 5 %), more somewhere on the longest window under it, so a shorter gate
    # would flag stationary points.
    gate = saturation.MIN_TREND_WINDOW_S
    false = rates.trend_false(rows)
    assert set(false) == {"15 s", "30 s", "60 s", "90 s"}
    long = [k for k, (_, dur) in rates.LENGTHS.items() if k in false and dur >= gate]
    short = max((k for k in false if k not in long), key=lambda k: rates.LENGTHS[k][1])
    assert long == ["60 s", "90 s"] and short == "30 s"
    for k in long:
        assert all(f / n <= rates.FALSE_MAX for n, f in false[k].values())
        n, f = map(sum, zip(*false[k].values(), strict=True))
        assert n >= 80 and rates.wilson(f, n)[1] < 0.05
    assert max(f / n for n, f in false[short].values()) > rates.FALSE_MAX
    # ... and with the gate, the verdict on long windows keeps the target and catches 1.05x.
    for k in long:
        n, f = rates.calm(rows, k)
        assert f / n <= rates.FALSE_MAX
        at = {(r["mode"], r["load"]): r for r in rates.rates(rows) if r["length"] == k}
        assert all(at[(m, 1.05)]["share"] >= rates.DETECT_MIN for m in ("on", "off"))


def test_targets_catch_a_detector_that_misses_them():
    # A wrong detector's rows: 3 of 100 stationary points flagged, 94 of 100 overloaded ones.
    bad = [{"kind": "point", "length": "15 s", "mode": "off", "load": 0.8, "saturated": i < 3} for i in range(100)]
    bad += [{"kind": "point", "length": "15 s", "mode": "off", "load": 1.1, "saturated": i < 94} for i in range(100)]
    bad += [{"kind": "point", "length": "84 requests", "mode": "off", "load": 0.8, "saturated": True}]
    assert rates.meets_targets(rates.rates(bad)) == ["15 s off at 0.8: 3.0% flagged > 2%",
                                                    "15 s off at 1.1: 94.0% flagged < 95%"]


def test_half_load_and_wilson():
    assert rates.half_load([(0.8, 0.0), (0.9, 0.2), (1.0, 0.8), (1.1, 1.0)]) == pytest.approx(0.95)
    assert math.isnan(rates.half_load([(0.8, 0.0), (1.1, 0.4)]))
    lo, hi = rates.wilson(0, 100)
    assert lo == 0.0 and hi == pytest.approx(0.0370, abs=1e-4)


@pytest.mark.slow  # builds two simulated engines (a vLLM import)
def test_points_of_the_file_are_what_this_code_gives(rows):
    caps = {r["mode"]: r["capacity_req_s"] for r in rows if r["kind"] == "capacity"}
    # (length, mode, load, repeat).  60 s OFF at 0.8, repeat 109: a level backlog whose trend's
    # estimate passes 3 % of the arrivals and its lower bound only 0: not flagged with the limit known.
    k = rates.FIRST_REPEAT + 3
    keys = {("15 s", m, x, k) for m in ("on", "off") for x in (0.8, 1.1)} | {("60 s", "off", 1.05, k), ("60 s", "off", 0.8, 109)}
    picked = [r for r in rows if r["kind"] == "point" and (r["length"], r["mode"], r["load"], r["repeat"]) in keys]
    assert len(picked) == 6
    for r in picked:
        got = rates.point(r["mode"], r["length"], r["load"], caps[r["mode"]], r["repeat"])
        assert got == r


# ----------------------------------------------------------------- the window gate, synthetic

LIMIT = 256  # max_num_seqs, as h200-tp1's


def backlog(window_s: float, rate: float = 20.0, load: float = 1.05, first_e2e_s: float = 2.0) -> pd.DataFrame:
    """Requests every 1 / ``rate`` s through ``window_s`` s, answered in order, one every
    ``load`` / ``rate`` s after ``first_e2e_s``: an engine at ``load`` x its capacity whose backlog
    grows by (1 - 1 / load) of the arrivals (1.05: 4.8 %, 0.95 req/s at 20 req/s)."""
    n = round(window_s * rate) + 1
    sent = np.arange(n) / rate
    done = first_e2e_s + np.arange(n) * load / rate
    return typed_requests(pd.DataFrame({
        "mode": "off", "rate": rate, "repeat": 0, "request_index": range(n), "warmup": False,
        "scheduled_s": sent, "sent_s": sent, "e2e_ms": (done - sent) * 1e3, "ttft_ms": 10.0, "tpot_ms": 1.0,
        "prompt_tokens": 100, "output_tokens": 10, "num_cached_tokens": 0, "expected_cached_tokens": 0,
        "error": ""}))


def test_a_long_window_at_1_05x_capacity_is_saturated_by_the_trend_with_the_limit_known():
    # 60 s: the backlog grows 40 -> 97 requests, far from the 256-request limit; every request is
    # answered, 97 % of them within the window.  Only the trend shows it.
    s = saturation.saturation(backlog(60.0), None, LIMIT)
    assert s["full_share"] == 0.0 and s["completion_ratio"] > saturation.COMPLETION_MIN
    assert s["n_unfinished_open"] == 0
    assert s["backlog_growth_per_s"] == pytest.approx(20 - 20 / 1.05, rel=0.02)
    assert s["backlog_growth_lo"] > 0.9
    assert s["saturated"] and s["reason"].startswith("backlog grew 0.95 req/s (5% of arrivals; in system")
    assert s["reason"].endswith("; a trend over 60 s of arrivals)")
    # The report's code for it.
    from prefixstudy.report.saturation_codes import codes
    assert codes(s["reason"]) == ["grew"]


def test_the_same_backlog_over_a_short_window_is_not_judged_by_the_trend():
    # Wrong data for the trend on a 15-s window: the same growth, steady (its lower bound above
    # 0), is not a verdict there, where a filling engine looks the same.
    s = saturation.saturation(backlog(15.0), None, LIMIT)
    assert s["backlog_growth_per_s"] == pytest.approx(20 - 20 / 1.05, rel=0.05) and s["backlog_growth_lo"] > 0
    assert not s["saturated"] and s["reason"] == ""
    # Just under the gate the same; at it, the trend decides.
    assert not saturation.saturation(backlog(saturation.MIN_TREND_WINDOW_S - 1), None, LIMIT)["saturated"]
    assert saturation.saturation(backlog(saturation.MIN_TREND_WINDOW_S), None, LIMIT)["saturated"]


def test_a_level_long_window_is_not_saturated():
    # Each request 2 s in the system at 20 req/s for 90 s: 40 in it, level, from the burn-in on.
    s = saturation.saturation(backlog(90.0, load=1.0), None, LIMIT)
    assert s["backlog_growth_per_s"] == 0.0 and s["backlog_growth_lo"] == 0.0
    assert not s["saturated"] and s["reason"] == ""
