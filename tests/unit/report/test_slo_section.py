"""The report's SLO search section: the sentence's numbers come from the manifest's record, the
gain's bounds from the two brackets, and the interpolation beside it from headline.csv."""

from __future__ import annotations

import math

import pandas as pd

from prefixstudy.report import slo as slo_report

SEARCH = {"objectives_ms": {"e2e_p90": 1000.0}, "tolerance": 0.05, "repeats": 3,
          "arms": {"on": {"rates_tried_req_s": [8.0, 16.0, 32.0, 64.0, 45.3, 38.1, 41.6, 39.8], "lo_req_s": 39.8,
                          "hi_req_s": 41.6, "hi_verdict": "missed", "final_rate_req_s": 39.8, "repeats_met": 3,
                          "stopped": "converged"},
                   "off": {"rates_tried_req_s": [8.0, 16.0, 11.3, 13.5, 12.3, 12.9], "lo_req_s": 12.3,
                           "hi_req_s": 12.9, "hi_verdict": "saturated", "final_rate_req_s": 12.3, "repeats_met": 3,
                           "stopped": "saturated"}}}

# headline.csv of the same probes: ON's p90 crosses 1000 ms between 32 (800) and 45.3 (1600) req/s,
# OFF's between 8 (500) and 16 (2000)
HEAD = pd.DataFrame({"rate": [8.0, 16.0, 32.0, 45.3], "arrival_rate": [8.0, 16.0, 32.0, 45.3],
                     "on_saturated": [False] * 4, "off_saturated": [False, False, False, False],
                     "on_saturated_share": [0.0, 0.0, 0.0, 0.0], "off_saturated_share": [0.0, 0.0, math.nan, math.nan],
                     "on_mean_e2e_ms": [1.0] * 4, "off_mean_e2e_ms": [1.0, 1.0, math.nan, math.nan],
                     "on_p90_e2e_ms": [300.0, 400.0, 800.0, 1600.0], "off_p90_e2e_ms": [500.0, 2000.0, math.nan, math.nan],
                     **{f"{m}_p90_e2e_{s}": [math.nan] * 4 for m in ("on", "off") for s in ("lo", "hi")}})


def test_the_sentence_states_the_searched_gain_its_bounds_and_why_each_search_stopped():
    first, second = slo_report.sentences(SEARCH, ("on", "off"), HEAD)
    # 39.8 / 12.3 = 3.236; bounds 39.8 / 12.9 = 3.085 and 41.6 / 12.3 = 3.382
    assert first == ("At e2e p90 ≤ 1000 ms, ON sustains 39.8 req/s and OFF 12.3 req/s, each searched to 5% and met "
                     "there in 3 and 3 of 3 repeats: ON buys 3.24× the throughput at this SLO [3.09, 3.38] (the brackets' "
                     "bounds). Stopped: ON converged (the upper rate missed an objective); OFF converged (the upper "
                     "rate saturated: the engine's limit, not the SLO's).")
    # ON: 32 + (1000 - 800) * 13.3 / 800 = 35.325; OFF: 8 + (1000 - 500) * 8 / 1500 = 10.667
    assert second == ("Interpolated instead, as the headline does (p90 E2E ≤ 1000 ms between the rates probed): ON "
                      "35.3 req/s, OFF 10.7 req/s, 3.31×.")


def test_an_arm_stopped_at_max_rate_is_a_lower_bound_and_one_that_met_nothing_has_no_gain():
    at_max = {**SEARCH, "arms": {**SEARCH["arms"], "on": {**SEARCH["arms"]["on"], "lo_req_s": 100.0,
                                                           "hi_req_s": None, "stopped": "max rate"}}}
    text = slo_report.sentences(at_max, ("on", "off"), pd.DataFrame())
    assert text == [("At e2e p90 ≤ 1000 ms, ON sustains 100 req/s and OFF 12.3 req/s, each searched to 5% and met "
                     "there in 3 and 3 of 3 repeats: ON buys at least 8.13× the throughput at this SLO [7.75, ∞] (the brackets' "
                     "bounds). Stopped: ON met at max rate (the answer is at least this); OFF converged (the upper "
                     "rate saturated: the engine's limit, not the SLO's).")]
    none = {**SEARCH, "arms": {**SEARCH["arms"], "off": {**SEARCH["arms"]["off"], "lo_req_s": None,
                                                          "stopped": "min rate"}}}
    assert slo_report.sentences(none, ("on", "off"), HEAD) == [
        "At e2e p90 ≤ 1000 ms, OFF met the SLO at no rate searched; no gain to state."]


def test_a_run_without_a_search_has_no_section():
    assert slo_report.blocks({}, pd.DataFrame(), pd.DataFrame(), ("on", "off")) == []
