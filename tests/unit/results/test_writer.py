"""The results writer and the study's sink: fixed layout, one write per point, the hit-rate switch,
resume bookkeeping, file modes."""

import json

import pandas as pd
import pytest

from prefixstudy.config import load_config
from prefixstudy.results import load, typed_iterations, typed_requests
from prefixstudy.results.writer import ResultsWriter
from prefixstudy.schema import PointResult
from prefixstudy.study.orchestrate import Study, StudyFailed


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


def study(tmp_path, **sets):
    w = writer(tmp_path, **sets)
    return Study(w.cfg, w)


def test_every_point_adds_its_rows(tmp_path):
    w = writer(tmp_path)
    w.add(point("on", 2.0, 1152))
    res = load(tmp_path)
    assert len(res.requests) == 3 and res.summary["hit_rate_measured"].tolist() == [pytest.approx(1152 / 1214)]
    w.add(point("off", 2.0, 0))
    res = load(tmp_path)
    assert len(res.requests) == 6 and res.summary["mode"].tolist() == ["on", "off"]
    assert not list(tmp_path.rglob(".*.tmp"))  # no temp files left behind
    # Each point is its own part, written once: adding OFF left ON's part as it was.
    assert sorted(p.name for p in (tmp_path / "requests.parquet").iterdir()) == ["off-2.parquet", "on-2.parquet"]


def test_results_follow_the_umask(tmp_path):
    import os
    import stat

    old = os.umask(0o022)
    try:
        w = writer(tmp_path)
        w.add(point("on", 2.0, 1152))
    finally:
        os.umask(old)
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert sorted(p.relative_to(tmp_path).as_posix() for p in files) == [
        "config.yaml", "iterations.parquet/on-2.parquet", "manifest.json", "requests.parquet/on-2.parquet",
        "summary.csv"]
    assert {stat.S_IMODE(p.stat().st_mode) for p in files} == {0o644}


def test_an_older_single_file_run_is_split_into_parts_when_resumed(tmp_path):
    w = writer(tmp_path)
    w.add(point("on", 1.0, 1152))
    w.add(point("on", 2.0, 1152))
    whole = load(tmp_path).requests
    for name in ("requests.parquet", "iterations.parquet"):  # as runs wrote them before the part folders
        df = pd.read_parquet(tmp_path / name)
        for p in (tmp_path / name).iterdir():
            p.unlink()
        (tmp_path / name).rmdir()
        df.to_parquet(tmp_path / name)
    pd.testing.assert_frame_equal(load(tmp_path).requests, whole)
    w2 = ResultsWriter(tmp_path, w.cfg, {"points": w.points})
    w2.keep([p if p["rate"] == 1.0 else {**p, "status": "failed"} for p in w.points], load(tmp_path).summary)
    assert sorted(p.name for p in (tmp_path / "requests.parquet").iterdir()) == ["on-1.parquet"]
    pd.testing.assert_frame_equal(load(tmp_path).requests, whole[whole["rate"] == 1.0].reset_index(drop=True))


def test_hit_rate_mismatch_warns_by_default(tmp_path, caplog):
    row = study(tmp_path).point_done(point("on", 2.0, 0))
    assert row["hit_rate_ok"] is False or row["hit_rate_ok"] == False  # noqa: E712
    assert "prefix hit rate 0.000, expected 0.949" in caplog.text
    assert json.loads((tmp_path / "manifest.json").read_text())["points"][0]["status"] == "ok"


def test_hit_rate_mismatch_fails_the_run_when_asked(tmp_path):
    s = study(tmp_path, **{"checks.fail_on_hit_rate_mismatch": True})
    with pytest.raises(StudyFailed, match=r"cache OFF @ 4 req/s \(repeat 0\): prefix hit rate 0\.949, expected 0\.000"):
        s.point_done(point("off", 4.0, 1152))
    (p,) = json.loads((tmp_path / "manifest.json").read_text())["points"]
    assert p["status"] == "failed" and p["error"].startswith("hit-rate check:")


def test_resume_keeps_ok_points_and_plans_the_rest(tmp_path):
    w = writer(tmp_path, **{"sweep.rates": [1, 2, 4]})
    for r in (1.0, 2.0):
        w.add(point("on", r, 1152))
    w.add(point("off", 1.0, 0))
    w.points[-1]["status"] = "failed"
    w2 = ResultsWriter(tmp_path, w.cfg, {"points": w.points})
    w2.keep(w.points, load(tmp_path).summary)
    assert [(p["mode"], p["rate"]) for p in w2.points] == [("on", 1.0), ("on", 2.0)]
    req = load(tmp_path).requests
    assert sorted(set(zip(req["mode"], req["rate"]))) == [("on", 1.0), ("on", 2.0)]
    # The arms take turns: one plan over both, ON's two kept points marked done.
    plans = Study(w.cfg, w2).pending()
    assert [(c.sweep.modes, plan.points, plan.done) for c, plan in plans] == [
        (["on", "off"], ((1.0, 0), (2.0, 0), (4.0, 0)), frozenset({("on", 1.0, 0), ("on", 2.0, 0)}))]


def test_point_cap_shorter_than_the_schedule_is_refused():
    from prefixstudy.errors import UserError
    from prefixstudy.study.preflight import check_plan

    check_plan(load_config(None, {"sweep.rates": [1], "sweep.num_requests": 40, "sweep.max_point_duration_s": 50}))
    with pytest.raises(UserError, match=r"field 'sweep.max_point_duration_s': 45 s is too short for 40 requests "
                                        r"at 1 req/s; use at least 50 s"):
        check_plan(load_config(None, {"sweep.rates": [1, 8], "sweep.num_requests": 40,
                                      "sweep.max_point_duration_s": 45}))
