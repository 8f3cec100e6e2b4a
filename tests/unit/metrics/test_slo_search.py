"""The SLO search's decisions (metrics.slo_search): exact rate sequences against a known limit,
each way a search stops, the objectives' values of a point, and the parser's one-line errors."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from prefixstudy.config.slo import SloSearchConfig, parse_objectives
from prefixstudy.errors import UserError
from prefixstudy.metrics.slo_search import gain_bracket, objective_values, search_arm, verdict

def search(**kw) -> SloSearchConfig:
    """A search for p90 E2E <= 200 ms from 8 req/s, its range set as SloSearchConfig.resolved sets it."""
    return SloSearchConfig(objectives={"e2e_p90": 200.0}, **kw).resolved([8.0, 1000.0])


SPEC = search()


def point(rate: float, repeat: int, outcome: str) -> dict:
    """A recorded point whose p90 E2E meets (100 ms) or misses (300 ms) SPEC's 200 ms."""
    return {"mode": "on", "rate": rate, "repeat": repeat, "status": "failed" if outcome == "failed" else "ok",
            "saturated": outcome == "saturated", "slo_ms": {"e2e_p90": 100.0 if outcome == "met" else 300.0}}


def drive(spec: SloSearchConfig, repeats: int, outcome):
    """Run the search against ``outcome(rate, repeat)`` the way the study does, round by round."""
    points: list[dict] = []
    for _ in range(100):
        s = search_arm("on", points, spec, repeats)
        if s.stopped:
            return s, [(p["rate"], p["repeat"]) for p in points]
        assert s.next_points, "a search that has not stopped asks for a point"
        points += [point(r, k, outcome(r, k)) for r, k in s.next_points]
    raise AssertionError("the search did not stop")


def test_brackets_then_bisects_to_the_tolerance_then_repeats_at_the_final_rate():
    s, ran = drive(SPEC, 3, lambda r, k: "met" if r <= 37 else "missed")
    # doubling from 8 until 64 misses; geometric midpoints at 3 significant digits: sqrt(32*64) = 45.25
    # -> 45.3, sqrt(32*45.3) -> 38.1, sqrt(32*38.1) -> 34.9, sqrt(34.9*38.1) -> 36.5; 38.1 / 36.5 = 1.044 <= 1.05
    assert ran == [(8.0, 0), (16.0, 0), (32.0, 0), (64.0, 0), (45.3, 0), (38.1, 0), (34.9, 0), (36.5, 0),
                   (36.5, 1), (36.5, 2)]
    assert (s.lo, s.hi, s.stopped, s.final_rate, s.repeats_met) == (36.5, 38.1, "converged", 36.5, 3)


def test_an_upper_end_that_saturated_says_so():
    s, _ = drive(SPEC, 1, lambda r, k: "met" if r <= 37 else "saturated")
    assert (s.lo, s.hi, s.hi_verdict, s.stopped) == (36.5, 38.1, "saturated", "saturated")


def test_a_repeat_that_misses_at_the_final_rate_moves_the_answer_below_it():
    s, ran = drive(SPEC, 2, lambda r, k: "met" if r <= 37 and (r, k) != (36.5, 1) else "missed")
    assert ran[-3:] == [(36.5, 0), (36.5, 1), (34.9, 1)]  # 36.5 fails its repeat: 34.9 is within 5 % below it
    assert (s.lo, s.hi, s.stopped, s.repeats_met) == (34.9, 36.5, "converged", 2)


def test_meeting_the_slo_at_max_rate_stops_there_with_no_upper_end():
    s, ran = drive(search(max_rate=100), 2, lambda r, k: "met")
    assert ran == [(8.0, 0), (16.0, 0), (32.0, 0), (64.0, 0), (100.0, 0), (100.0, 1)]
    assert (s.lo, s.hi, s.stopped) == (100.0, None, "max rate")


def test_missing_at_the_start_halves_down_to_the_answer_or_min_rate():
    s, ran = drive(SPEC, 1, lambda r, k: "met" if r <= 2.5 else "missed")
    assert ran == [(8.0, 0), (4.0, 0), (2.0, 0), (2.83, 0), (2.38, 0), (2.6, 0), (2.49, 0)]
    assert (s.lo, s.hi, s.stopped) == (2.49, 2.6, "converged")
    s, ran = drive(search(min_rate=1), 1, lambda r, k: "missed")
    assert ran == [(8.0, 0), (4.0, 0), (2.0, 0), (1.0, 0)]
    assert (s.lo, s.final_rate, s.stopped) == (None, None, "min rate")


def test_a_failed_point_stops_the_search_and_max_probes_caps_it():
    s, ran = drive(SPEC, 1, lambda r, k: "failed" if r == 32 else "met")
    assert ran[-1] == (32.0, 0) and (s.lo, s.stopped) == (16.0, "failures")
    s, ran = drive(search(max_probes=5), 1,
                   lambda r, k: "met" if r <= 37 else "missed")
    assert len(ran) == 5 and (s.lo, s.hi, s.stopped) == (32.0, 45.3, "max probes")


def test_a_met_rate_above_a_missed_one_is_noise_and_does_not_raise_the_answer():
    pts = [point(8, 0, "met"), point(16, 0, "missed"), point(32, 0, "met")]
    s = search_arm("on", pts, SPEC, 1)
    assert (s.lo, s.hi, s.next_points) == (8.0, 16.0, [(11.3, 0)])


def test_objective_values_count_failed_and_unfinished_requests_as_over_any_bound():
    n = 10
    df = pd.DataFrame({"warmup": [False] * n, "error": [""] * 8 + ["boom", ""], "finished": [True] * 9 + [False],
                       "e2e_ms": np.arange(1, n + 1, dtype=float) * 10, "ttft_ms": [5.0] * n,
                       "tpot_ms": [np.nan] + [2.0] * (n - 1)})
    objectives = {"e2e_p50": 1.0, "e2e_p90": 1.0, "tpot_p50": 1.0, "itl_p99": 1.0}
    v = objective_values(df, {"p99": 7.5}, objectives)
    # 8 counted (10..80 ms) and 2 over any bound: the median of [10..80, big, big] is (50 + 60) / 2
    assert v["e2e_p50"] == 55.0
    assert v["e2e_p90"] is None  # the 90th percentile lands on the failed ones
    assert v["tpot_p50"] == 2.0  # one-token request skipped
    assert v["itl_p99"] is None  # a request failed: the pooled gaps are not the point's
    ok = df.assign(error="", finished=True)
    assert objective_values(ok, {"p99": 7.5}, {"itl_p99": 1.0}) == {"itl_p99": 7.5}


def test_an_unset_range_comes_from_the_sweeps_rates():
    r = SloSearchConfig(objectives={"e2e_p90": 1.0}).resolved([2.0, 4.0, 96.0])
    assert (r.start_rate, r.min_rate, r.max_rate) == (2.0, 0.25, 96.0)
    r = SloSearchConfig(objectives={"e2e_p90": 1.0}, start_rate=500, min_rate=3).resolved([2.0, 96.0])
    assert (r.start_rate, r.min_rate, r.max_rate) == (96.0, 3.0, 96.0)  # the start kept within the range


def test_verdict_and_the_gain_bracket():
    assert verdict(point(1, 0, "met"), SPEC.objectives) == "met"
    assert verdict(point(1, 0, "saturated"), SPEC.objectives) == "saturated"
    assert verdict({**point(1, 0, "met"), "slo_ms": {"e2e_p90": None}}, SPEC.objectives) == "missed"
    ratio, lo, hi = gain_bracket({"lo_req_s": 60.0, "hi_req_s": 63.0}, {"lo_req_s": 20.0, "hi_req_s": 21.0})
    assert (ratio, lo, hi) == (3.0, 60 / 21, 63 / 20)
    assert gain_bracket({"lo_req_s": 100.0, "hi_req_s": None}, {"lo_req_s": 20.0, "hi_req_s": 21.0})[2] == math.inf
    assert math.isnan(gain_bracket({"lo_req_s": None}, {"lo_req_s": 20.0})[0])


@pytest.mark.parametrize("text, message", [
    ("e2e_p90:2000,ttft_p90:500", None),
    ("e2e_p90=2000", None),
    ("e2e:2000", "--slo e2e:2000: 'e2e' is not METRIC_pPCT"),
    ("e2e_p90:2000,latency_p90:5", "--slo e2e_p90:2000,latency_p90:5: 'latency_p90' is not METRIC_pPCT"),
    ("e2e_p0:5", "'e2e_p0': the percentile must be in (0, 100], got 0"),
    ("e2e_p90:fast", "'e2e_p90:fast': 'fast' is not a number of ms"),
    ("e2e_p90:-1", "'e2e_p90:-1': the objective must be a finite number of ms > 0"),
    ("e2e_p90:1,e2e_p90:2", "'e2e_p90' given twice"),
    ("e2e_p90", "'e2e_p90' is not METRIC_pPCT:MS"),
])
def test_parse_objectives_names_the_bad_token(text, message):
    if message is None:
        assert parse_objectives(text)["e2e_p90"] == 2000.0
        return
    with pytest.raises(UserError) as e:
        parse_objectives(text)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_the_dataset_and_the_point_limit_cover_the_searchs_range():
    from prefixstudy.config import load_config
    from prefixstudy.study.preflight import check_plan
    from prefixstudy.workloads.base import synthetic_count

    cfg = load_config(None, {"engine": {"kind": "echo"}, "sweep.rates": [1, 4], "sweep.min_duration_s": 10,
                             "sweep.slo": {"objectives": {"e2e_p90": 100}, "max_rate": 50}})
    assert cfg.sweep.rate_extent() == [0.125, 1.0, 4.0, 50.0]
    assert synthetic_count(cfg) == 500  # 10 s of arrivals at 50 req/s, where a sweep of [1, 4] needs 40
    cfg.sweep.max_point_duration_s = 300  # 40 requests at min_rate 0.125 req/s need 1.25 x 320 s
    with pytest.raises(UserError, match="too short for 40 requests at 0.125 req/s; use at least 400 s"):
        check_plan(cfg)


def test_an_itl_objective_keeps_its_percentile_of_the_pooled_gaps():
    from prefixstudy.config import load_config

    cfg = load_config(None, {"engine": {"kind": "echo"}, "sweep.slo": {"objectives": {"itl_p95": 40, "e2e_p97": 900}}})
    assert cfg.percentiles == [50.0, 90.0, 95.0, 99.0]  # the point's itl_ms then carries p95; e2e reads requests
