"""prefixstudy.metrics against hand-computed answers on small frames."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from prefixstudy.metrics import compare, engine_fit, requests, summary
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


# ----------------------------------------------------------------- saturation

def its(mode, rate, waiting, t=None):
    t = np.arange(len(waiting), dtype=float) if t is None else t
    return pd.DataFrame({"mode": mode, "rate": rate, "t_s": t, "num_waiting": waiting,
                         "step_ms": 10.0, "prompt_tokens": 0, "generation_tokens": 1})


def test_queue_growth_thirds():
    it = pd.concat([its("on", 1.0, [0, 1, 2, 3, 4, 5, 6, 7, 8]),        # 1.0 -> 7.0: growing
                    its("off", 1.0, [4, 5, 4, 5, 4, 5, 4, 5, 4])])     # 4.33 -> 4.33: flat
    q = summary.queue_growth(it).set_index("mode")
    assert q.loc["on", "wait_first"] == 1.0 and q.loc["on", "wait_last"] == 7.0
    assert q.loc["on", "wait_growth"] == 6.0 and q.loc["on", "queue_growing"]
    assert q.loc["off", "wait_growth"] == 0.0 and not q.loc["off", "queue_growing"]


def test_queue_growth_thresholds():
    # +1.5 requests is below QUEUE_GROWTH_MIN (2); 10 -> 14 is +4 but under +50 %.
    it = pd.concat([its("on", 1.0, [0, 0, 0, 1, 1, 1, 1.5, 1.5, 1.5]),
                    its("on", 2.0, [10, 10, 10, 12, 12, 12, 14, 14, 14]),
                    its("on", 4.0, [10, 10, 10, 13, 13, 13, 15, 15, 15])])  # +5, exactly 50 %
    q = summary.queue_growth(it).set_index("rate")
    assert q["queue_growing"].tolist() == [False, False, True]


def test_queue_growth_ignores_the_drain_after_the_last_arrival():
    it = its("on", 1.0, [0, 2, 4, 6, 8, 6, 4, 2, 0])
    assert not summary.queue_growth(it).loc[0, "queue_growing"]  # thirds: 2.0 vs 2.0
    end = pd.DataFrame({"mode": ["on"], "rate": [1.0], "end_s": [4.0]})
    q = summary.queue_growth(it, end)  # window t <= 4: first (0, 2) -> 1.0, last (6, 8) -> 7.0
    assert q.loc[0, "wait_first"] == 1.0 and q.loc[0, "wait_last"] == 7.0 and q.loc[0, "queue_growing"]


def saturation_table(r, it, achieved=None):
    """summary.saturation per mode (it takes one point), as a table indexed by mode."""
    rows = []
    for mode in ("on", "off"):
        a = None if achieved is None else float(achieved.set_index("mode").loc[mode, "achieved_rate"])
        rows.append({"mode": mode, **summary.saturation(r[r["mode"] == mode], it[it["mode"] == mode], a)})
    return pd.DataFrame(rows).set_index("mode")


def test_saturation_flags_and_reasons():
    # Four requests scheduled 1 s apart, E2E 100 ms: keep-up rate = 4 / (3 + 0.1) s.
    rows = []
    for mode in ("on", "off"):
        for k in range(4):
            rows.append({"mode": mode, "request_index": k, "scheduled_s": float(k), "sent_s": float(k),
                         "e2e_ms": 100.0})
    r = req(rows)
    it = pd.concat([its("on", 1.0, [0, 0, 0, 0]), its("off", 1.0, [0, 0, 0, 0])])
    keep_up = 4 / 3.1
    achieved = pd.DataFrame({"mode": ["on", "off"], "rate": [1.0, 1.0],
                             "achieved_rate": [keep_up, 0.94 * keep_up]})
    s = saturation_table(r, it, achieved)
    assert s.loc["on", "keep_up_rate"] == keep_up
    assert not s.loc["on", "saturated"] and s.loc["on", "reason"] == ""
    assert s.loc["off", "saturated"] and s.loc["off", "below_rate"]
    assert s.loc["off", "reason"] == "achieved 94% of offered"
    # without a summary the achieved rate is counted / (first send .. last completion) = 4 / 3.1 s
    s2 = saturation_table(r, it)
    assert s2.loc["on", "achieved_rate"] == keep_up and not s2["saturated"].any()
    # an unfinished request saturates the point
    r.loc[(r["mode"] == "on") & (r["request_index"] == 3), "error"] = "unfinished: point ended"
    s3 = saturation_table(r, it)
    assert s3.loc["on", "n_unfinished"] == 1 and s3.loc["on", "saturated"]


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


# ----------------------------------------------------------------- prefill share

def exact_iterations():
    """step_ms = 5 + 0.02 * prompt + 0.5 * generation, exactly."""
    rows = [("on", 100, 0), ("on", 0, 10), ("on", 50, 10),
            ("off", 200, 0), ("off", 0, 20), ("off", 100, 5)]
    it = pd.DataFrame([{"mode": m, "rate": 1.0, "prompt_tokens": p, "generation_tokens": g,
                        "step_ms": 5 + 0.02 * p + 0.5 * g} for m, p, g in rows])
    extra = pd.DataFrame([{"mode": "off", "rate": 1.0, "prompt_tokens": 0, "generation_tokens": 0, "step_ms": 3.0},
                          {"mode": "off", "rate": 1.0, "prompt_tokens": 7, "generation_tokens": 1, "step_ms": np.nan}])
    return pd.concat([it, extra], ignore_index=True)  # idle and first (NaN) records are not busy


def test_fit_step_cost_recovers_exact_coefficients():
    f = engine_fit.fit_step_cost(exact_iterations())
    assert f.loc[0, "group"] == "pooled" and f.loc[0, "n"] == 6
    assert f.loc[0, "a_ms"] == pytest.approx(5.0, rel=1e-12)
    assert f.loc[0, "b_ms_per_prompt_token"] == pytest.approx(0.02, rel=1e-12)
    assert f.loc[0, "c_ms_per_gen_token"] == pytest.approx(0.5, rel=1e-12)
    assert f.loc[0, "r2"] == pytest.approx(1.0, rel=1e-12)
    by = engine_fit.fit_step_cost(exact_iterations(), by="mode")
    assert by["group"].tolist() == ["off", "on"]
    assert by["b_ms_per_prompt_token"].tolist() == pytest.approx([0.02, 0.02], rel=1e-12)


def test_engine_prefill_share_exact():
    s = engine_fit.engine_prefill_share(exact_iterations()).set_index("mode")
    # ON: steps 7 + 10 + 11 = 28 ms, 150 prompt tokens * 0.02 = 3 ms.
    assert s.loc["on", "busy_ms"] == 28.0 and s.loc["on", "prompt_tokens"] == 150
    assert s.loc["on", "prefill_share_engine"] == pytest.approx(3.0 / 28.0, rel=1e-12)
    # OFF: 9 + 15 + 9.5 = 33.5 ms, 300 * 0.02 = 6 ms; the idle and NaN records are left out.
    assert s.loc["off", "busy_ms"] == 33.5 and s.loc["off", "prompt_tokens"] == 300
    assert s.loc["off", "prefill_share_engine"] == pytest.approx(6.0 / 33.5, rel=1e-12)


def test_fit_rank_deficient_gives_nan():
    it = pd.DataFrame({"mode": "on", "rate": 1.0, "prompt_tokens": [0, 0, 0, 0],
                       "generation_tokens": [1, 2, 3, 4], "step_ms": [1.0, 2.0, 3.0, 4.0]})
    f = engine_fit.fit_step_cost(it)
    assert math.isnan(f.loc[0, "b_ms_per_prompt_token"]) and f.loc[0, "n"] == 4


# ----------------------------------------------------------------- point row

def test_summary_row_matches_hand_values():
    r = req([{"request_index": k, "e2e_ms": float(v), "sent_s": float(k)} for k, v in enumerate([100, 200, 300, 400, 500])])
    r = r.assign(num_cached_tokens=0, expected_cached_tokens=0, dispatch_lag_ms=0.0)  # columns a summary row reads
    p = summary.summarize_point(r, {"mode": "on", "rate": 1.0})
    assert p["n_ok"] == 5 and p["mean_e2e_ms"] == 300.0 and p["p90_e2e_ms"] == 460.0
    assert p["duration_s"] == 4.5 and p["achieved_rate"] == 5 / 4.5
    assert p["prefill_share"] == 10.0 / 300.0
