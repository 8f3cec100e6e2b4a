import math

import pandas as pd
import pytest

from prefixstudy.metrics.requests import hit_rate_ok
from prefixstudy.metrics.summary import summarize_point
from prefixstudy.results import typed_requests
from prefixstudy.schema import SUMMARY_COLUMNS


def _req(**cols):
    n = len(next(iter(cols.values())))
    base = dict(mode=["on"] * n, rate=[2.0] * n, warmup=[False] * n, error=[""] * n, prompt_tokens=[100] * n,
                output_tokens=[10] * n, num_cached_tokens=[64] * n, expected_cached_tokens=[64] * n,
                request_index=list(range(n)), dispatch_lag_ms=[0.1] * n)
    base.update(cols)
    return typed_requests(pd.DataFrame(base))


def test_summary_arithmetic_exact():
    req = _req(
        sent_s=[0.0, 1.0, 2.0, 3.0], scheduled_s=[0.0, 1.0, 2.0, 3.0],
        e2e_ms=[100.0, 200.0, 300.0, 400.0], ttft_ms=[10.0, 20.0, 30.0, 40.0],
        prefill_ms=[5.0, 5.0, 5.0, 25.0], queue_ms=[1.0, 1.0, 1.0, 1.0], decode_ms=[90.0, 180, 270, 350],
        tpot_ms=[10.0, 20, 30, 40], dispatch_lag_ms=[0.0, 1.0, 2.0, 3.0])
    row = summarize_point(req, {"mode": "on", "rate": 2.0, "n_sent": 4})
    assert list(row) == SUMMARY_COLUMNS
    assert row["n_ok"] == 4 and row["n_failed"] == 0 and row["n_unfinished"] == 0
    assert row["duration_s"] == pytest.approx(3.4)  # first send 0.0 -> last finish 3.0 + 0.4
    assert row["achieved_rate"] == pytest.approx(4 / 3.4)
    assert row["output_tok_s"] == pytest.approx(40 / 3.4)
    assert row["mean_e2e_ms"] == 250.0
    assert row["p50_e2e_ms"] == 250.0
    assert row["p90_e2e_ms"] == pytest.approx(370.0)  # linear: 300 + 0.7 * 100
    assert row["p99_e2e_ms"] == pytest.approx(397.0)
    assert row["mean_prefill_ms"] == 10.0
    assert row["prefill_share"] == pytest.approx(10.0 / 250.0)
    assert row["hit_rate_measured"] == pytest.approx(0.64) and row["hit_rate_expected"] == pytest.approx(0.64)
    assert row["hit_rate_ok"] is True
    assert row["dispatch_lag_p50_ms"] == 1.5
    assert row["arrival_rate"] == 1.0  # 3 gaps over 3 s, whatever the configured rate
    # E2E climbs through the point (first third 150 ms, last 350), but four requests that all left
    # within the window are no backlog: the thirds are reported, not a verdict
    assert (row["e2e_first_ms"], row["e2e_last_ms"]) == (150.0, 350.0)
    assert row["saturated"] is False and row["saturation_reason"] == ""


def test_failures_and_unfinished_are_counted_not_dropped():
    req = _req(sent_s=[0.0, 0.5, 1.0], scheduled_s=[0.0, 0.5, 1.0], e2e_ms=[100.0, math.nan, math.nan],
               error=["", "EngineDeadError: x", "unfinished: request_timeout_s (1 s) passed"])
    row = summarize_point(req, {"mode": "on", "rate": 2.0, "n_sent": 3})
    assert (row["n_sent"], row["n_ok"], row["n_failed"], row["n_unfinished"]) == (3, 1, 1, 1)
    assert row["saturated"] is True  # a request left unfinished means the point fell behind


def test_saturation_when_completions_lag_arrivals():
    # 10 requests scheduled 0.1 s apart (10 req/s) but finishing 1 s apart: the engine kept up with 1 req/s.
    n = 10
    req = _req(sent_s=[0.1 * i for i in range(n)], scheduled_s=[0.1 * i for i in range(n)],
               e2e_ms=[(1.0 * i + 0.5 - 0.1 * i) * 1e3 for i in range(n)])
    row = summarize_point(req, {"mode": "on", "rate": 10.0, "n_sent": n})
    assert row["saturated"] is True


def test_hit_rate_checks():
    assert hit_rate_ok("off", 0.0, 0.0, 0.05) is True
    assert hit_rate_ok("off", 0.01, 0.0, 0.05) is False
    assert hit_rate_ok("on", 0.90, 0.949, 0.05) is True
    assert hit_rate_ok("on", 0.85, 0.949, 0.05) is False


def test_growing_waiting_queue_marks_the_point_saturated():
    from prefixstudy.metrics.summary import summarize
    from prefixstudy.results import typed_iterations

    n = 6
    req = _req(sent_s=[0.2 * i for i in range(n)], scheduled_s=[0.2 * i for i in range(n)], e2e_ms=[100.0] * n)
    points = [{"mode": "on", "rate": 2.0, "n_sent": n}]
    assert summarize(req, points)["saturated"].tolist() == [False]
    # Waiting requests climb from 0 to 10 across the arrival window (0 .. 1.0 s): every step of its
    # last half has requests waiting.
    it = typed_iterations(pd.DataFrame({"mode": ["on"] * 11, "rate": [2.0] * 11, "t_s": [0.1 * i for i in range(11)],
                                        "num_waiting": list(range(11))}))
    got = summarize(req, points, iterations=it)
    assert got["saturated"].tolist() == [True] and got["waiting_share"].tolist() == [1.0]


def test_requests_cut_before_sending_do_not_mean_saturation():
    # The point cap stopped the schedule: 2 requests were never sent; the engine kept up with the rest.
    n = 6
    req = _req(sent_s=[0.0, 0.5, 1.0, 1.5, math.nan, math.nan], scheduled_s=[0.5 * i for i in range(n)],
               e2e_ms=[100.0] * 4 + [math.nan] * 2,
               error=[""] * 4 + ["unfinished: not sent before max_point_duration_s"] * 2)
    row = summarize_point(req, {"mode": "on", "rate": 2.0, "n_sent": n})
    assert (row["n_ok"], row["n_unfinished"]) == (4, 2)
    assert row["saturated"] is False
