"""prefixstudy.metrics against hand-computed answers on small frames."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from prefixstudy.metrics import compare, requests, summary
from prefixstudy.errors import UserError


def req(rows):
    """Request rows from (mode, rate, request_index, e2e_ms, **overrides) dicts."""
    base = {"mode": "on", "rate": 1.0, "request_index": 0, "warmup": False, "error": "",
            "ttft_ms": 10.0, "tpot_ms": 1.0, "e2e_ms": 100.0, "queue_ms": 0.0, "prefill_ms": 10.0,
            "decode_ms": 90.0, "sent_s": 0.0, "scheduled_s": 0.0, "prompt_tokens": 100,
            "output_tokens": 10, "itl_mean_ms": 1.0}
    return pd.DataFrame([{**base, **r} for r in rows])


# ----------------------------------------------------------------- percentiles

def test_percentile_linear_interpolation():
    assert requests.percentile([1, 2, 3, 4, 5], 90) == 4.6  # 4 + 0.6 * (5 - 4)
    assert requests.percentile([10, 20], 50) == 15.0
    assert requests.percentile([5, np.nan, 1], 100) == 5.0
    assert math.isnan(requests.percentile([], 50))
    assert requests.percentiles([1, 2, 3, 4, 5], (50, 90, 99)) == {50: 3.0, 90: 4.6, 99: 4.96}


def test_counted_drops_warmup_and_errors():
    r = req([{"request_index": 0}, {"request_index": 1, "warmup": True},
             {"request_index": 2, "error": "unfinished: cancelled"}])
    assert requests.counted(r)["request_index"].tolist() == [0]


# ----------------------------------------------------------------- bootstrap

def test_gain_and_bootstrap_gain_ci_exact_for_constants():
    assert compare.gain([50.0, 50.0], [100.0, 100.0]) == 0.5
    assert compare.bootstrap_gain_ci([50.0] * 5, [100.0] * 8) == (0.5, 0.5)


def test_caching_gain_per_rate():
    r = req([{"mode": "on", "rate": 1.0, "e2e_ms": 60.0}, {"mode": "on", "rate": 1.0, "e2e_ms": 80.0},
             {"mode": "off", "rate": 1.0, "e2e_ms": 100.0}, {"mode": "off", "rate": 1.0, "e2e_ms": 180.0},
             {"mode": "on", "rate": 2.0, "e2e_ms": 90.0}, {"mode": "off", "rate": 2.0, "e2e_ms": 90.0}])
    g = compare.caching_gain(r, "e2e_ms", n_boot=200, seed=1)
    assert g["rate"].tolist() == [1.0, 2.0]
    assert g["gain"].tolist() == [0.5, 0.0]  # (140 - 70) / 140, and equal means
    assert g.loc[1, "ci_lo"] == 0.0 and g.loc[1, "ci_hi"] == 0.0
    assert g["n_on"].tolist() == [2, 1]
    again = compare.caching_gain(r, "e2e_ms", n_boot=200, seed=1)
    pd.testing.assert_frame_equal(g, again)


# ----------------------------------------------------------------- paired

def test_paired_differences_by_rate_and_index():
    r = req([
        {"mode": "on", "request_index": 0, "e2e_ms": 100.0},
        {"mode": "on", "request_index": 1, "e2e_ms": 200.0},
        {"mode": "on", "request_index": 2, "e2e_ms": 300.0},
        {"mode": "on", "request_index": 3, "e2e_ms": 1.0, "error": "boom"},  # not counted: no pair
        {"mode": "off", "request_index": 0, "e2e_ms": 150.0},
        {"mode": "off", "request_index": 1, "e2e_ms": 180.0},
        {"mode": "off", "request_index": 2, "e2e_ms": 400.0},
        {"mode": "off", "request_index": 3, "e2e_ms": 500.0},
        {"mode": "off", "request_index": 0, "rate": 2.0, "e2e_ms": 999.0},  # other rate: no pair
    ])
    p = compare.paired_differences(r, "e2e_ms")
    assert p["request_index"].tolist() == [0, 1, 2]
    assert p["delta"].tolist() == [50.0, -20.0, 100.0]
    s = compare.paired_summary(p)
    assert s.loc[0, "n_pairs"] == 3
    assert s.loc[0, "mean_delta"] == pytest.approx(130.0 / 3, abs=0)
    assert s.loc[0, "median_delta"] == 50.0
    assert s.loc[0, "on_faster_share"] == 2 / 3


# ----------------------------------------------------------------- SLO / goodput

def test_parse_slo():
    assert requests.parse_slo("ttft=200,e2e=2000") == {"ttft": 200.0, "e2e": 2000.0}
    assert requests.parse_slo(" tpot = 50 , e2el:1500ms ") == {"tpot": 50.0, "e2e": 1500.0}
    assert requests.parse_slo(None) == {} and requests.parse_slo("") == {}


@pytest.mark.parametrize("text, words", [
    ("ttft", "not KEY=MS"), ("ttft=abc", "not a number"), ("itl=5", "unknown key 'itl'"),
    ("ttft=-1", "> 0"), ("ttft=1,ttft=2", "given twice"), ("ttft=200;e2e=3", "not KEY=MS"),
    ("ttft=inf", "finite"),
])
def test_parse_slo_errors(text, words):
    with pytest.raises(UserError, match=words.replace("(", r"\(")):
        requests.parse_slo(text)


def test_goodput_counts_requests_within_every_slo():
    r = req([
        {"request_index": 0, "ttft_ms": 50.0, "e2e_ms": 900.0, "sent_s": 0.0},    # good
        {"request_index": 1, "ttft_ms": 150.0, "e2e_ms": 900.0, "sent_s": 0.5},   # ttft too slow
        {"request_index": 2, "ttft_ms": 50.0, "e2e_ms": 1100.0, "sent_s": 1.0},   # e2e too slow
        {"request_index": 3, "ttft_ms": 50.0, "e2e_ms": 1000.0, "sent_s": 1.5},   # on the limit: good
        {"request_index": 4, "warmup": True, "ttft_ms": 1.0, "e2e_ms": 1.0},      # warm-up: not counted
        {"request_index": 5, "error": "boom", "ttft_ms": 1.0, "e2e_ms": 1.0},     # failed: not good
    ])
    slo = {"ttft": 100.0, "e2e": 1000.0}
    g = requests.goodput(r, slo, durations=pd.DataFrame({"mode": ["on"], "rate": [1.0], "duration_s": [2.0]}))
    assert g.loc[0, "n_good"] == 2 and g.loc[0, "n_measured"] == 5
    assert g.loc[0, "goodput_rps"] == 1.0
    # without durations: first send (0.0 s) to last completion (1.5 s + 1.0 s)
    g2 = requests.goodput(r, slo)
    assert g2.loc[0, "duration_s"] == 2.5 and g2.loc[0, "goodput_rps"] == 0.8


def test_tpot_nan_counts_as_zero_like_vllm():
    r = req([{"tpot_ms": np.nan, "output_tokens": 1}, {"request_index": 1, "tpot_ms": 30.0}])
    assert requests.meets_slo(r, {"tpot": 20.0}).tolist() == [True, False]


def test_knee_and_max_rate():
    pts = pd.DataFrame({"mode": "on", "rate": [1.0, 2.0, 4.0, 8.0],
                        "p90_e2e_ms": [100.0, 150.0, 300.0, 200.0],
                        "saturated": [False, False, True, False]})
    assert summary.knee_rate(pts, "on") == 2.0  # the unsaturated 8 after a saturated 4 does not count
    assert math.isnan(summary.knee_rate(pts.assign(saturated=True), "on"))
    assert summary.knee_rate(pts.assign(saturated=False), "on") == 8.0
    assert summary.max_rate_meeting(pts, "p90_e2e_ms", 200.0, "on") == 2.0
    free = pts.assign(saturated=False)
    assert summary.max_rate_meeting(free, "p90_e2e_ms", 200.0, "on") == 2.0  # 4 fails, so 8 cannot count
    assert summary.max_rate_meeting(free, "p90_e2e_ms", 300.0, "on") == 8.0
    assert summary.max_rate_meeting(pts, "p90_e2e_ms", 300.0, "on") == 2.0  # 4 is saturated
    assert summary.max_rate_meeting(pts, "p90_e2e_ms", 300.0, "on", require_unsaturated=False) == 8.0
    assert math.isnan(summary.max_rate_meeting(pts, "p90_e2e_ms", 99.0, "on"))
    c = summary.max_rate_curve(free, "p90_e2e_ms", [99.0, 150.0, 1000.0], modes=("on",))
    assert c["max_rate"].tolist()[1:] == [2.0, 8.0] and math.isnan(c["max_rate"].iloc[0])


# ----------------------------------------------------------------- point row

def test_summary_row_matches_hand_values():
    r = req([{"request_index": k, "e2e_ms": float(v), "sent_s": float(k)} for k, v in enumerate([100, 200, 300, 400, 500])])
    r = r.assign(num_cached_tokens=0, expected_cached_tokens=0, dispatch_lag_ms=0.0)  # columns a summary row reads
    p = summary.summarize_point(r, {"mode": "on", "rate": 1.0})
    assert p["n_ok"] == 5 and p["mean_e2e_ms"] == 300.0 and p["p90_e2e_ms"] == 460.0
    assert p["duration_s"] == 4.5 and p["achieved_rate"] == 5 / 4.5
    assert p["prefill_share"] == 10.0 / 300.0
