"""The measurement instruments on synthetic series with known answers: saturation, the step-cost fit,
the engine prefill share and decode slowdown, block bootstraps, headline.csv, knee and threshold."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from prefixstudy.metrics import headline, saturation
from prefixstudy.shared import bootstrap
from prefixstudy.costmodel import engine_fit
from prefixstudy.schema import typed_iterations, typed_requests
from prefixstudy.results.migrate import migrate


def point(e2e_ms, gap_s=1.0, mode="on", rate=1.0, repeat=0, errors=None):
    """Requests scheduled every ``gap_s`` s and sent on time, with these E2E."""
    n = len(e2e_ms)
    return typed_requests(pd.DataFrame({
        "mode": mode, "rate": rate, "repeat": repeat, "request_index": range(n), "warmup": False,
        "scheduled_s": np.arange(n) * gap_s, "sent_s": np.arange(n) * gap_s, "e2e_ms": e2e_ms,
        "ttft_ms": 10.0, "tpot_ms": 1.0, "prompt_tokens": 100, "output_tokens": 10,
        "num_cached_tokens": 90 if mode == "on" else 0, "expected_cached_tokens": 90 if mode == "on" else 0,
        "error": errors if errors is not None else ""}))


def steps(in_system, t=None, mode="on", rate=1.0):
    t = np.arange(len(in_system), dtype=float) if t is None else np.asarray(t, dtype=float)
    return typed_iterations(pd.DataFrame({"mode": mode, "rate": rate, "timing": "engine", "t_s": t,
                                          "step_ms": 10.0, "num_running": in_system, "decode_tokens": 1}))


# ----------------------------------------------------------------- saturation

def queue(e2e_s, gap_s=0.1):
    """Requests every ``gap_s`` s, request i answered after ``e2e_s(i)`` seconds."""
    n = 200
    return point([e2e_s(i) * 1e3 for i in range(n)], gap_s=gap_s)


def test_a_level_backlog_is_not_saturated_whatever_its_size():
    # 10 req/s, each in the system 0.5 s: 5 in the system from the first answer on, exactly.
    s = saturation.saturation(queue(lambda i: 0.5), None)
    assert s["arrival_rate"] == pytest.approx(10.0) and s["completion_ratio"] == 1.0
    assert s["backlog_growth_per_s"] == 0.0 and s["backlog_growth_lo"] == 0.0
    assert not s["saturated"] and s["reason"] == ""


def test_a_backlog_that_grows_by_a_tenth_of_the_arrivals_is_saturated():
    # Departures every 0.11 s against arrivals every 0.1 s: load 1.1, the backlog grows by
    # 10 - 1 / 0.11 = 0.909 req/s (9 % of arrivals), as an engine at 1.1x its capacity does.
    s = saturation.saturation(queue(lambda i: 0.5 + 0.01 * i), None)
    assert s["backlog_growth_per_s"] == pytest.approx(10 - 1 / 0.11, rel=0.01)
    assert s["backlog_growth_lo"] > 0.8
    assert s["saturated"] and s["reason"].startswith("backlog grew 0.91 req/s (9% of arrivals; in system")
    assert s["reason"].endswith("; a trend test, weaker than the server's limit: engine.max_num_seqs)")


def test_a_significant_but_small_growth_is_not_a_backlog():
    # Departures every 0.102 s: the backlog grows by 0.196 req/s, steadily (its lower bound is above
    # 0), but that is 2 % of the arrivals, under GROWTH_SHARE_MIN: no practical backlog.
    s = saturation.saturation(queue(lambda i: 0.5 + 0.002 * i), None)
    assert s["backlog_growth_per_s"] == pytest.approx(10 - 1 / 0.102, rel=0.02)
    assert s["backlog_growth_lo"] > 0 and not s["saturated"]


def test_an_empty_engine_filling_up_is_not_a_backlog():
    # Each request 3 s in the system: the count rises 0 -> 30 through the first 3 s, then stays.
    # The thirds' means at the sends say 23.5 -> 30.1; the burn-in (the longest early E2E, 3 s)
    # leaves only the level part to test.
    s = saturation.saturation(queue(lambda i: 3.0), None)
    assert (round(s["in_system_first"], 1), round(s["in_system_last"], 1)) == (23.5, 30.1)
    assert s["backlog_growth_per_s"] == 0.0 and not s["saturated"]


def test_an_engine_that_ran_full_is_saturated():
    # 10 req/s, each 0.6 s in the system: 6 requests in it all through the window's last half.
    req = queue(lambda i: 0.6)
    full = saturation.saturation(req, None, limit=6)
    assert full["full_share"] == 1.0 and full["saturated"]
    assert full["reason"] == "ran full: 100% of the window's last half at >= 80% of its 6-request limit"
    roomy = saturation.saturation(req, None, limit=10)  # 6 < 8: room left to grow the batch
    assert roomy["full_share"] == 0.0 and not roomy["saturated"]
    # With a limit known, the trend test does not decide: a rising count with room left is a fill.
    rising = saturation.saturation(queue(lambda i: 0.5 + 0.01 * i), None, limit=256)
    assert rising["backlog_growth_lo"] > 0.8 and rising["full_share"] == 0.0 and not rising["saturated"]


def test_requests_that_waited_for_admission_saturate_the_point():
    # Steps every 0.1 s through the window (0 .. 19.9 s); its last half starts at 9.95 s.
    t = np.arange(200) * 0.1
    late = t >= 9.95

    def with_waiting(share):
        waiting = np.zeros(200, int)
        waiting[np.flatnonzero(late)[: round(share * late.sum())]] = 3
        it = steps([5] * 200, t=t)
        return it.assign(num_waiting=waiting)

    req = queue(lambda i: 0.5)
    s = saturation.saturation(req, with_waiting(0.6))
    assert s["waiting_share"] == 0.6 and s["saturated"]
    assert s["reason"] == "requests waited in 60% of the steps of the window's last half"
    s = saturation.saturation(req, with_waiting(0.4))
    assert s["waiting_share"] == 0.4 and not s["saturated"]
    # Engine steps known: the trend test does not decide (a rising count with nobody waiting).
    s = saturation.saturation(queue(lambda i: 0.5 + 0.01 * i), with_waiting(0.0))
    assert s["backlog_growth_lo"] > 0.8 and not s["saturated"]


def test_a_window_too_short_to_test_gets_no_trend_verdict():
    s = saturation.saturation(point([100.0] * 9), None)  # 9 arrivals, 8 after the burn-in (0.1 s)
    assert math.isnan(s["backlog_growth_per_s"]) and not s["saturated"]


def test_completions_that_fall_behind_saturate_the_point():
    # Early E2E 100 ms; the last 3 of 12 take 5 s and finish after the window (last send 11 s + 0.1 s).
    e2e = [100.0] * 9 + [5000.0] * 3
    s = saturation.saturation(point(e2e), steps([1] * 12))
    assert s["completion_ratio"] == 0.75
    assert "completed 75% of arrivals in the window" in s["reason"]
    # one late request of twelve (92 %) is not a trend
    assert saturation.saturation(point([100.0] * 11 + [5000.0]), steps([1] * 12))["completion_ratio"] == 11 / 12
    assert "completed" not in saturation.saturation(point([100.0] * 11 + [5000.0]), steps([1] * 12))["reason"]


def test_two_late_requests_flag_a_point_of_fewer_than_20():
    # The last request sent, a hair slower than the early ones, is late by itself: the window is
    # extended only by the early requests' longest E2E.  One late request is not a trend.
    gap = 1 / 64
    s = saturation.saturation(point([100.0] * 5 + [100.5], gap_s=gap), None)
    assert s["completion_ratio"] == 5 / 6 and not s["saturated"]

    def two_late(n: int) -> dict:  # ... and one more, held up just over an arrival gap at the end
        return saturation.saturation(point([100.0] * (n - 2) + [100.0 + gap * 1e3 + 1.0, 100.5], gap_s=gap), None)

    s = two_late(6)  # flags the point
    assert s["completion_ratio"] == 4 / 6 and s["saturated"]
    assert s["reason"] == "completed 67% of arrivals in the window"

    def flagged(n: int) -> bool:  # by the completion rule, whatever the others say
        return "completed" in two_late(n)["reason"]

    assert [n for n in range(3, 41) if not flagged(n)][0] == 20
    assert all(flagged(n) for n in range(3, 20))


def test_unfinished_sent_request_saturates_and_arrival_rate_is_the_schedules():
    r = point([100.0] * 5, gap_s=0.25, errors=["", "", "", "", "unfinished: cancelled at max_point_duration_s"])
    s = saturation.saturation(r, None)
    assert s["arrival_rate"] == 4.0  # 4 gaps over 1 s
    assert s["n_unfinished_open"] == 1 and s["saturated"] and s["reason"].startswith("1 unfinished")


# ----------------------------------------------------------------- step-cost fit

def cost_steps(n=200, seed=0, mode="off", rate=8.0, repeat=0, a=5.0, b=0.02, e=1.5, c=0.1):
    """Engine steps whose cost is exactly a + b*prefill + e*prefill_reqs + c*decode."""
    rng = np.random.default_rng(seed)
    nreq = rng.integers(0, 3, n)
    pt = nreq * rng.integers(50, 1300, n)
    dec = rng.integers(1, 60, n)
    ms = a + b * pt + e * nreq + c * dec
    t_end = np.cumsum(ms) / 1e3
    return typed_iterations(pd.DataFrame({
        "mode": mode, "rate": rate, "repeat": repeat, "timing": "engine", "step_start_s": t_end - ms / 1e3,
        "t_s": t_end, "step_ms": ms, "prefill_tokens": pt, "num_prefill_reqs": nreq, "decode_tokens": dec,
        "num_running": dec, "num_waiting": 0}))


def test_fit_recovers_the_step_cost_and_the_share_is_exact():
    it = pd.concat([cost_steps(seed=1), cost_steps(seed=2, mode="on")], ignore_index=True)
    fit = engine_fit.fit_step_cost(it, n_boot=20)
    assert fit.coef == pytest.approx([5.0, 0.02, 1.5, 0.1, 0.0], rel=1e-9)
    assert fit.r2 == pytest.approx(1.0) and fit.n == 400 and fit.rmse_ms == pytest.approx(0.0, abs=1e-9)
    a = engine_fit.step_arrays(it[it["mode"] == "off"])
    prefill = 0.02 * a[:, 0] + 1.5 * a[:, 1]
    share, slowdown = engine_fit.stats(a, fit.coef)
    assert share == pytest.approx(prefill.sum() / a[:, 5].sum(), rel=1e-9)
    assert slowdown == pytest.approx((a[:, 2] * a[:, 5]).sum() / (a[:, 2] * (a[:, 5] - prefill)).sum(), rel=1e-9)
    cols = engine_fit.engine_columns(it, fit).set_index("mode")
    assert cols.loc["off", "engine_prefill_share"] == pytest.approx(share, rel=1e-9)
    assert cols.loc["off", "busy_steps"] == 200 and cols.loc["off", "step_timing"] == "engine"
    # the coefficients are exact in every refit; the interval is the spread of which steps a point had
    assert cols.loc["off", "engine_prefill_share_lo"] < share < cols.loc["off", "engine_prefill_share_hi"]


def test_frontend_timed_steps_after_idle_are_not_busy_time():
    # Old runs: the first record after an idle spell (nothing in flight before it) carries the gap.
    old = pd.DataFrame({
        "mode": "on", "rate": 1.0, "t_s": [1.0, 1.02, 1.04, 3.0, 3.02], "step_ms": [np.nan, 20, 20, 1960, 20],
        "prompt_tokens": [62, 0, 0, 62, 0], "generation_tokens": [1, 1, 1, 1, 1],
        "num_running": [1, 1, 0, 1, 1], "num_waiting": 0})
    it = typed_iterations(migrate({"iterations": old}, {})[0]["iterations"])  # as a folder's reader brings them
    assert (it["timing"] == "frontend").all() and it["prefill_tokens"].tolist() == [62, 0, 0, 62, 0]
    assert engine_fit.busy_steps(it)["t_s"].tolist() == [1.02, 1.04, 3.02]  # 1960 ms after idle: dropped


def test_echo_request_rows_are_not_steps():
    it = cost_steps(n=10).assign(timing="request")
    assert engine_fit.busy_steps(it).empty and engine_fit.fit_step_cost(it) is None


def test_per_request_term_dropped_when_prompts_are_all_alike():
    it = cost_steps(n=50, seed=3)
    it["prefill_tokens"] = it["num_prefill_reqs"] * 1214  # tokens = 1214 x requests: e not identifiable
    it["step_ms"] = 5.0 + 0.02 * it["prefill_tokens"] + 0.1 * it["decode_tokens"]
    fit = engine_fit.fit_step_cost(it, n_boot=5)
    assert fit.coef == pytest.approx([5.0, 0.02, 0.0, 0.1, 0.0], rel=1e-9, abs=1e-12)



def test_nnls_matches_least_squares_inside_the_orthant_and_clamps_outside_it():
    A = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    assert engine_fit.nnls(A, np.array([2.0, 3.0, 5.0])) == pytest.approx([2.0, 3.0])
    # least squares says (3, -1); with x2 >= 0 the best is x2 = 0 and x1 = mean of rows 1 and 3 = 2.5
    assert np.linalg.lstsq(A, np.array([3.0, -1.0, 2.0]), rcond=None)[0] == pytest.approx([3.0, -1.0])
    assert engine_fit.nnls(A, np.array([3.0, -1.0, 2.0])) == pytest.approx([2.5, 0.0])


def test_a_per_request_term_that_least_squares_makes_negative_is_zero_and_no_share_is_negative():
    """Steps whose prefill requests cost less than nothing beyond their tokens (as plain least
    squares read h200-multiturn): the fit keeps e at 0 and every prefill share >= 0."""
    it = cost_steps(n=300, seed=4, e=0.0)
    it["step_ms"] = it["step_ms"] - 2.0 * it["num_prefill_reqs"]
    X = engine_fit.design(engine_fit.busy_steps(it))
    assert np.linalg.lstsq(X[:, :4], it["step_ms"].to_numpy(), rcond=None)[0][2] == pytest.approx(-2.0)
    fit = engine_fit.fit_step_cost(it, n_boot=10)
    assert fit.coef[2] == 0.0 and (fit.coef >= 0).all() and (fit.draws >= 0).all()
    X3 = X[:, [0, 1, 3]]
    assert fit.coef[[0, 1, 3]] == pytest.approx(np.linalg.lstsq(X3, it["step_ms"].to_numpy(), rcond=None)[0])
    assert engine_fit.stats(engine_fit.step_arrays(it), fit.coef)[0] > 0


def test_the_context_term_is_kept_where_it_explains_the_steps_and_left_out_where_it_does_not():
    it = cost_steps(n=300, seed=5)
    rng = np.random.default_rng(5)
    it["context_tokens"] = it["decode_tokens"] * rng.integers(200, 3000, len(it))  # varied contexts
    it["cached_tokens"] = 0
    with_ctx = it.assign(step_ms=it["step_ms"] + 0.0004 * it["context_tokens"])
    assert engine_fit.fit_step_cost(with_ctx, n_boot=0).coef == pytest.approx([5.0, 0.02, 1.5, 0.1, 0.0004])
    # context that costs nothing: kept out (0), the other terms exact
    assert engine_fit.fit_step_cost(it, n_boot=0).coef == pytest.approx([5.0, 0.02, 1.5, 0.1, 0.0], abs=1e-12)
    # the prefill share counts a prefilling request's context (its prompt) under k
    a = engine_fit.step_arrays(with_ctx)
    coef = np.array([5.0, 0.02, 1.5, 0.1, 0.0004])
    p = 0.02 * a[:, 0] + 1.5 * a[:, 1] + 0.0004 * a[:, 0]
    assert engine_fit.stats(a, coef)[0] == pytest.approx(p.sum() / a[:, 5].sum())


# ----------------------------------------------------------------- bootstraps

def test_block_indices_are_runs_of_consecutive_items():
    idx = bootstrap.block_indices(16, np.random.default_rng(0))
    assert len(idx) == 16 and bootstrap.block_length(16) == 4
    assert all((idx[i + 1] - idx[i]) % 16 == 1 for i in range(0, 16, 4) for i in range(i, i + 3))


def test_block_bootstrap_of_a_trend_is_wider_than_an_iid_one():
    # A queue that builds up: consecutive values correlate; blocks keep that, iid resampling hides it.
    x = np.repeat(np.arange(10.0), 10)[:, None] * 100 + 1000
    block = bootstrap.interval(bootstrap.hierarchical([x], lambda r: r[:, 0].mean(), seed=1))
    rng = np.random.default_rng(1)
    iid = bootstrap.interval([x[rng.integers(0, 100, 100), 0].mean() for _ in range(400)])
    assert block[1] - block[0] > 1.3 * (iid[1] - iid[0])


def test_repeats_put_run_to_run_spread_in_the_interval():
    runs = [np.full((30, 1), 100.0), np.full((30, 1), 120.0), np.full((30, 1), 110.0)]
    lo, hi = bootstrap.interval(bootstrap.hierarchical(runs, lambda r: r[:, 0].mean(), seed=0))
    assert lo < 105 and hi > 115  # within each run there is no spread at all
    assert bootstrap.interval(bootstrap.hierarchical(runs[:1], lambda r: r[:, 0].mean(), seed=0)) == (100.0, 100.0)


# ----------------------------------------------------------------- headline, knee, threshold

def test_headline_pairs_on_with_off_and_marks_bounds():
    reqs = pd.concat([point([50.0] * 10, mode="on", repeat=k) for k in (0, 1)]
                     + [point([100.0] * 10, mode="off", repeat=k) for k in (0, 1)], ignore_index=True)
    summ = pd.DataFrame({"mode": ["on", "on", "off", "off"], "rate": 1.0, "repeat": [0, 1, 0, 1],
                         "arrival_rate": [1.0, 1.0, 1.0, 1.0], "saturated": [False, False, False, True]})
    h = headline.headline(reqs, summ).iloc[0]
    assert h["n_repeats"] == 2 and h["n_pairs"] == 20 and h["arrival_rate"] == 1.0
    assert h["gain_mean_e2e"] == 0.5 and (h["gain_mean_e2e_lo"], h["gain_mean_e2e_hi"]) == (0.5, 0.5)
    assert h["on_mean_e2e_ms"] == 50.0 and h["off_p90_e2e_ms"] == 100.0 and h["on_spread_pct"] == 0.0
    assert h["off_saturated"] and not h["on_saturated"] and h["gain_is_bound"]
    assert (h["on_hit_rate"], h["on_hit_rate_expected"]) == (0.9, 0.9)


def test_knee_and_rate_at_threshold_interpolate_on_actual_rates():
    head = pd.DataFrame({"arrival_rate": [0.8, 4.2, 8.5, 16.4, 22.7],
                         "off_saturated": [False, False, False, False, True],
                         "off_p90_e2e_ms": [100.0, 120.0, 200.0, 1000.0, 3000.0],
                         "off_p90_e2e_lo": [90.0, 110.0, 180.0, 900.0, 2500.0],
                         "off_p90_e2e_hi": [110.0, 130.0, 220.0, 1100.0, 3500.0]})
    assert headline.knee(head, "off") == ((16.4 + 22.7) / 2, 16.4, 22.7)
    rate, lo, hi = headline.rate_at_threshold(head, "off", 600.0)
    assert rate == pytest.approx(8.5 + 400 / 800 * 7.9)
    assert lo == pytest.approx(8.5 + 380 / 880 * 7.9) and hi == pytest.approx(8.5 + 420 / 720 * 7.9)
    assert headline.rate_at_threshold(head, "off", 5000.0)[0] == 16.4  # next is saturated: a bound
    assert math.isnan(headline.rate_at_threshold(head, "off", 50.0)[0])
    assert headline.knee(head.assign(off_saturated=False), "off")[1] == 22.7


def test_a_rate_the_mode_never_ran_is_passed_over_not_counted_as_kept_up():
    # OFF ran 0.8, 4.2 and 22.7 only (headline.csv: NaN share and latency at the rates it skipped).
    head = pd.DataFrame({"arrival_rate": [0.8, 4.2, 8.5, 16.4, 22.7],
                         "off_saturated_share": [0.0, 0.0, np.nan, np.nan, 1.0],
                         "off_mean_e2e_ms": [100.0, 120.0, np.nan, np.nan, 3000.0]})
    assert headline.knee(head, "off") == ((4.2 + 22.7) / 2, 4.2, 22.7)
    # and with nothing saturated after it, the knee is beyond the last rate OFF ran, not the last rate
    k = headline.knee(head.iloc[:4], "off")
    assert math.isnan(k[0]) and k[1] == 4.2 and math.isnan(k[2])


def test_the_knee_bracket_names_its_evidence_and_one_noisy_repeat_moves_nothing():
    head = pd.DataFrame({"arrival_rate": [1.0, 8.0, 16.0, 20.0, 24.0], "n_repeats": 3,
                         "off_saturated_share": [0.0, 1 / 3, 0.0, 2 / 3, 1.0],
                         "off_mean_e2e_ms": [900.0, 1400.0, 2200.0, 3100.0, 4300.0]})
    b = headline.knee_bracket(head, "off")
    assert (b["lo"], b["lo_saturated"], b["lo_repeats"], b["hi"], b["hi_saturated"]) == (16.0, 0, 3, 20.0, 2)
    assert b["mixed"] == [(8.0, 1, 3), (20.0, 2, 3)]
    assert b["text"] == ("OFF's knee lies between 16.0 req/s (kept up in 3 of 3 repeats) and 20.0 req/s "
                         "(saturated in 2 of 3); repeats disagreed at 8.0 req/s (1 of 3 saturated)")
    # the noisy repeat at 8 req/s does not move the knee: the same bracket without it
    quiet = headline.knee_bracket(head.assign(off_saturated_share=[0.0, 0.0, 0.0, 2 / 3, 1.0]), "off")
    assert (quiet["lo"], quiet["hi"], quiet["mixed"]) == (16.0, 20.0, [(20.0, 2, 3)])
    none = headline.knee_bracket(head.assign(off_saturated_share=0.0), "off")
    assert none["text"] == "OFF kept up in every repeat of every rate it ran, up to 24.0 req/s: its knee is beyond"
    tie = headline.knee_bracket(head.assign(n_repeats=2, off_saturated_share=[0.0, 0.0, 0.0, 0.0, 0.5]), "off")
    assert tie["text"] == ("OFF kept up in most repeats of every rate it ran, up to 24.0 req/s (kept up in 1 of 2 "
                           "repeats): its knee is beyond")
    first = headline.knee_bracket(head.assign(off_saturated_share=1.0), "off")
    assert first["text"] == "OFF saturated already at its lowest rate, 1.0 req/s (saturated in 3 of 3)"


def test_two_repeats_get_a_t_interval_over_their_means():
    runs = [np.full((30, 1), 100.0), np.full((30, 1), 120.0)]
    est, lo, hi = bootstrap.over_repeats(runs, lambda r: np.array([r[:, 0].mean()]))
    # mean 110, sd 14.142, se 10, t(0.975, 1) = 12.7062
    assert est[0] == 110.0 and (lo[0], hi[0]) == pytest.approx((110 - 127.062, 110 + 127.062), abs=1e-2)
    # every repeat's own mean is inside its interval (the percentile bootstrap's was not always)
    three = runs + [np.full((30, 1), 110.0)]
    _, lo3, hi3 = bootstrap.over_repeats(three, lambda r: np.array([r[:, 0].mean()]))
    assert lo3[0] < 100 and hi3[0] > 120 and hi3[0] - 110 == pytest.approx(4.3027 * 10 / math.sqrt(3), abs=1e-3)
    # one repeat: the within-run block bootstrap (no spread inside a constant run)
    _, lo1, hi1 = bootstrap.over_repeats(runs[:1], lambda r: np.array([r[:, 0].mean()]))
    assert (lo1[0], hi1[0]) == (100.0, 100.0)


def test_a_t_interval_is_cut_where_the_statistic_cannot_go():
    runs = [np.full((10, 1), 100.0), np.full((10, 1), 900.0)]
    _, lo, hi = bootstrap.over_repeats(runs, lambda r: np.array([r[:, 0].mean()]), bounds=(0.0, math.inf))
    # 500 +- 12.7062 * 400: the lower end would be -4582 ms
    assert lo[0] == 0.0 and hi[0] == pytest.approx(500 + 12.7062 * 400, abs=0.1)


@pytest.mark.parametrize("n", [1, 4, 9, 30, 129, 1000])
def test_the_headline_statistics_vectorized_give_the_loops_values_bit_for_bit(n):
    """hierarchical() evaluates a Stat's ``many`` on all resamples at once: the same draws, and the
    same value per resample as ``one`` (pairwise sums per row, the same order statistics)."""
    from prefixstudy.metrics.headline import MEAN_P90, PAIRED_GAIN

    rng = np.random.default_rng(n)
    for k, stat in ((1, MEAN_P90), (2, PAIRED_GAIN)):
        x = rng.lognormal(5, 1, size=(n, k))
        fast = bootstrap.hierarchical([x], stat, seed=7, n_boot=200)
        assert fast.shape == (200, 2)
        assert np.array_equal(fast, bootstrap.hierarchical([x], stat.one, seed=7, n_boot=200), equal_nan=True)
