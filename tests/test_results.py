"""The results writer: fixed layout, per-point rewrites, the hit-rate switch, resume bookkeeping."""

import json

import pandas as pd
import pytest

from prefixstudy.config import load_config
from prefixstudy.results import load, typed_iterations, typed_requests
from prefixstudy.runner import PointResult
from prefixstudy.study import ResultsWriter, StudyFailed, _pending_configs


def point(mode, rate, cached, expected=1152, n=3):
    req = typed_requests(pd.DataFrame({
        "mode": [mode] * n, "rate": [rate] * n, "request_index": range(n), "warmup": [False] * n,
        "prompt_tokens": [1214] * n, "output_tokens": [4] * n, "num_cached_tokens": [cached] * n,
        "expected_cached_tokens": [expected if mode == "on" else 0] * n, "scheduled_s": [0.0, 0.5, 1.0],
        "sent_s": [0.0, 0.5, 1.0], "e2e_ms": [100.0] * n, "ttft_ms": [10.0] * n, "error": [""] * n}))
    return PointResult(mode, rate, req, typed_iterations(pd.DataFrame()), {"status": "ok", "error": "", "n_sent": n})


def writer(tmp_path, **sets):
    cfg = load_config(None, sets)
    w = ResultsWriter(tmp_path, cfg, {"status": "running", "points": []})
    w.start()
    return w


def test_every_point_rewrites_all_files(tmp_path):
    w = writer(tmp_path)
    w.add(point("on", 2.0, 1152))
    res = load(tmp_path)
    assert len(res.requests) == 3 and res.summary["hit_rate_measured"].tolist() == [pytest.approx(1152 / 1214)]
    w.add(point("off", 2.0, 0))
    res = load(tmp_path)
    assert len(res.requests) == 6 and res.summary["mode"].tolist() == ["on", "off"]
    assert not list(tmp_path.glob(".*.tmp"))  # no temp files left behind


def test_hit_rate_mismatch_warns_by_default(tmp_path, caplog):
    w = writer(tmp_path)
    row = w.add(point("on", 2.0, 0))
    assert row["hit_rate_ok"] is False or row["hit_rate_ok"] == False  # noqa: E712
    assert "prefix hit rate 0.000, expected 0.949" in caplog.text
    assert json.loads((tmp_path / "manifest.json").read_text())["points"][0]["status"] == "ok"


def test_hit_rate_mismatch_fails_the_run_when_asked(tmp_path):
    w = writer(tmp_path, **{"checks.fail_on_hit_rate_mismatch": True})
    with pytest.raises(StudyFailed, match=r"cache OFF @ 4 req/s: prefix hit rate 0\.949, expected 0\.000"):
        w.add(point("off", 4.0, 1152))
    (p,) = json.loads((tmp_path / "manifest.json").read_text())["points"]
    assert p["status"] == "failed" and p["error"].startswith("hit-rate check:")


def test_resume_keeps_ok_points_and_plans_the_rest(tmp_path):
    w = writer(tmp_path, **{"sweep.rates": [1, 2, 4]})
    for r in (1.0, 2.0):
        w.add(point("on", r, 1152))
    w.add(point("off", 1.0, 0))
    w.points[-1]["status"] = "failed"
    w2 = ResultsWriter(tmp_path, w.cfg, {"points": w.points})
    w2.keep_finished(load(tmp_path).requests, pd.DataFrame(), w.points)
    assert [(p["mode"], p["rate"]) for p in w2.points] == [("on", 1.0), ("on", 2.0)]
    assert sorted(set(zip(w2.requests[0]["mode"], w2.requests[0]["rate"]))) == [("on", 1.0), ("on", 2.0)]
    plans = _pending_configs(w.cfg, w2)
    assert [(c.sweep.modes, c.sweep.rates) for c in plans] == [(["on"], [4.0]), (["off"], [1.0, 2.0, 4.0])]


def test_point_cap_shorter_than_the_schedule_is_refused():
    from prefixstudy.errors import UserError
    from prefixstudy.study import check_plan

    check_plan(load_config(None, {"sweep.rates": [1], "sweep.num_requests": 40, "sweep.max_point_duration_s": 50}))
    with pytest.raises(UserError, match=r"field 'sweep.max_point_duration_s': 45 s is too short for 40 requests "
                                        r"at 1 req/s; use at least 50 s"):
        check_plan(load_config(None, {"sweep.rates": [1, 8], "sweep.num_requests": 40,
                                      "sweep.max_point_duration_s": 45}))
