"""The table `prefixstudy run` prints after its points: every point's requests, duration, request
and output-token throughput and TTFT / TPOT / E2E mean, median and p99, the numbers of summary.csv."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from prefixstudy.report.console import bench_table
from tests import forkcli

HEAD = ("mode", "rate", "ok/sent", "dur s", "req/s", "out tok/s",
        "TTFT ms mean/p50/p99", "TPOT ms mean/p50/p99", "E2E ms mean/p50/p99")


@pytest.mark.slow
def test_a_run_prints_one_row_per_point_with_summary_csvs_numbers(tmp_path):
    r = forkcli.run(["run", "--set", "engine.kind=echo", "--set", "engine.decode_ms_per_token=1", "--executor", "local",
                     "--rates", "20,40", "--num-requests", "6", "--set", "sweep.warmup_requests=0", "--no-report",
                     "--quiet", "--out", tmp_path], timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    (run,) = (tmp_path / "default").iterdir()
    assert [ln.split("]")[0] for ln in lines[:4]] == ["[ ON     20 req/s", "[OFF     20 req/s", "[OFF     40 req/s",
                                                      "[ ON     40 req/s"]  # the arms take turns
    assert lines[4].split() == " ".join(HEAD).split() and lines[-1] == f"results: {run}"
    s = pd.read_csv(run / "summary.csv")
    rows = [ln.split() for ln in lines[5:-1]]
    assert len(rows) == 4

    def f1(v):
        return f"{v:.1f}"

    for row, (_, p) in zip(rows, s.iterrows(), strict=True):
        assert row[:4] == [p["mode"].upper(), f"{p['rate']:g}", "6/6", f1(p["duration_s"])]
        assert row[4:6] == [f"{p['achieved_rate']:.2f}", f1(p["output_tok_s"])]
        for cell, key in zip(row[6:], ("ttft", "tpot", "e2e"), strict=True):
            assert cell == "/".join(f1(p[f"{m}_{key}_ms"]) for m in ("mean", "p50", "p99"))
    assert float(rows[0][8].split("/")[0]) >= 5.0  # 6 output tokens at 1 ms each after the first: E2E is not 0


def test_repeats_get_a_column_and_missing_numbers_a_dash():
    s = pd.DataFrame([{"mode": "on", "rate": 2.0, "repeat": r, "n_ok": 0, "n_sent": 3, "duration_s": math.nan,
                       "achieved_rate": 1.5, "output_tok_s": 12.0, "mean_ttft_ms": 1.25, "p50_ttft_ms": 1.0,
                       "p99_ttft_ms": 2.0} for r in (0, 1)])
    lines = bench_table(s)
    assert lines[0].split()[:3] == ["mode", "rate", "rep"]
    assert [ln.split() for ln in lines[1:]] == [
        ["ON", "2", str(r), "0/3", "-", "1.50", "12.0", "1.2/1.0/2.0", "-/-/-", "-/-/-"] for r in (0, 1)]
    assert bench_table(pd.DataFrame()) == []
