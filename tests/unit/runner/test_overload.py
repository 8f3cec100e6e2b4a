"""Overload: arrivals far past what the engine serves.  The point is cut at max_point_duration_s,
every planned request is a row (the ones still open are `unfinished`, none `failed`), and the point
is flagged saturated.  The echo engine takes 4 s per request here, longer than request_timeout_s
and the point's deadline, so no request can finish whatever the machine's load; the real engine's
overload case is in tests/integration/test_faults.py."""

from __future__ import annotations

import pytest

from prefixstudy.config import load_config
from prefixstudy.results import load
from prefixstudy.study.orchestrate import run_study

TIMED_OUT = "unfinished: request_timeout_s (0.75 s) passed"
CANCELLED = "unfinished: cancelled at max_point_duration_s"


@pytest.mark.slow
def test_overload_is_cut_at_the_point_deadline_and_flagged(tmp_path):
    cfg = load_config(None, {"engine": {"kind": "echo", "decode_ms_per_token": 1000}, "executor": "local",
                             "out": str(tmp_path), "dataset.prefix_len": 32, "dataset.suffix_len": 4,
                             "dataset.output_len": 5, "sweep.rates": [240], "sweep.modes": ["off"],
                             "sweep.num_requests": 120, "sweep.warmup_requests": 0,
                             "sweep.max_point_duration_s": 1, "sweep.request_timeout_s": 0.75})
    res = load(run_study(cfg, progress=False))
    (row,) = res.summary.to_dict("records")
    assert row["status"] == "ok"
    assert row["n_sent"] == 120 and row["n_ok"] == 0 and row["n_failed"] == 0 and row["n_unfinished"] == 120
    assert bool(row["saturated"]) is True
    err = res.measured["error"]
    assert len(err) == 120 and set(err.str.split(":").str[0]) == {"unfinished"}
    # Sent early: its own timeout; sent late: the point's deadline came first.
    assert set(err) <= {TIMED_OUT, CANCELLED}
    (point,) = res.manifest["points"]
    assert point["duration_s"] == pytest.approx(1.0, abs=0.5) and point["duration_s"] < 1.5  # the deadline
