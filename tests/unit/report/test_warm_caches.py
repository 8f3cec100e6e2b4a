"""Warm caches are flagged in what a user reads: peer files (`prefixstudy report --peer`) with a point
whose prefix-cache hit rate is above the dataset's bound (its cache was warm before it ran), and
studies whose cold starts the probe (runner.cold) could not prove, in their report and in `compare`."""

from __future__ import annotations

import json
import logging
import math

import pandas as pd

from prefixstudy.report.bench_import import peer_points, warm_peers
from prefixstudy.engines.echo import EchoEngine
from prefixstudy.report.build import build_report
from prefixstudy.report.compare import build_compare
from prefixstudy.report.data import cold_start_notes
from prefixstudy.results import load
from prefixstudy.study.orchestrate import run_study
from tests.unit.runner.test_runner import cfg_with


def _bench(rate: float, **extra) -> dict:
    return {"request_rate": rate, "request_throughput": rate, "mean_e2el_ms": 10.0, "mean_ttft_ms": 2.0,
            "total_input_tokens": 4800, **extra}


def test_hit_rates_are_read_from_counters_usage_or_a_rate(tmp_path):
    f = tmp_path / "p.json"
    f.write_text("\n".join(json.dumps(r) for r in [
        _bench(1, label="a", prefix_cache_hits=300, prefix_cache_queries=1200),
        _bench(2, label="b", total_cached_tokens=2400),  # of total_input_tokens 4800
        _bench(4, label="c", prefix_cache_hit_rate=0.25),
        _bench(8, label="d")]))
    p = peer_points(f).set_index("label")["hit_rate"]
    assert (p["a"], p["b"], p["c"]) == (0.25, 0.5, 0.25) and math.isnan(p["d"])


def _peers(rows: list[tuple[str, float, bool | None, float]]) -> pd.DataFrame:
    return pd.DataFrame([{"label": lab, "rate": r, "prefix_caching": c, "hit_rate": h} for lab, r, c, h in rows])


def test_a_point_above_the_dataset_s_bound_is_flagged_and_a_clean_one_is_not():
    peers = _peers([("warm ON", 1, True, 0.98), ("warm ON", 4, True, 0.66), ("warm ON", 16, True, 0.97),
                    ("clean ON", 1, True, 0.66), ("clean ON", 4, True, 0.69),  # within the tolerance
                    ("OFF", 1, False, 0.0), ("hot OFF", 1, False, 0.0), ("hot OFF", 4, False, 0.4),
                    ("no counts", 1, None, math.nan)])
    assert warm_peers(peers, 2 / 3, 0.05) == [
        "peer warm ON: its first point, at 1 req/s, hit 0.980 of its prompt tokens in the prefix cache, above the "
        "dataset's bound 0.667: its cache was warm before it ran (warm-cache contamination; 2 of 3 points with a "
        "hit rate are above)",
        "peer hot OFF: a point, at 4 req/s, hit 0.400 of its prompt tokens in the prefix cache, above the dataset's "
        "bound 0.000: its cache was warm before it ran (warm-cache contamination; 1 of 2 points with a hit rate "
        "are above)"]


def test_the_report_flags_a_contaminated_peer(tmp_path, caplog):
    run = run_study(cfg_with(out=str(tmp_path / "res"), **{"sweep.rates": [25, 50]}), progress=False)
    # The echo study's bound: 32 of each 48-token prompt (2 whole blocks of its 40-token prefix).
    warm, clean = tmp_path / "warm.json", tmp_path / "clean.json"
    warm.write_text(json.dumps([_bench(25, label="bench", enable_prefix_caching=True, prefix_cache_hits=4700,
                                       prefix_cache_queries=4800)]))
    clean.write_text(json.dumps([_bench(25, label="other", enable_prefix_caching=True, total_cached_tokens=3200)]))
    with caplog.at_level(logging.WARNING):
        build_report(run, peers=[warm, clean], n_boot=20)
    line = ("peer bench ON: its first point, at 25 req/s, hit 0.979 of its prompt tokens in the prefix cache, above "
            "the dataset's bound 0.667: its cache was warm before it ran (warm-cache contamination; 1 of 1 points "
            "with a hit rate are above)")
    assert line in (run / "report.md").read_text()
    assert [r.getMessage() for r in caplog.records if "contamination" in r.getMessage()] == [f"warning: {line}"]


def test_cold_starts_the_probe_could_not_prove_are_noted():
    def manifest(*probes):
        return {"points": [{"cold_probe": p} for p in probes]}

    assert cold_start_notes(manifest("cold", "caching off", "cold")) == []
    assert cold_start_notes({"points": [{"mode": "on"}]}) == []  # a run made before the probe
    assert cold_start_notes(manifest("cold", "warm", "unverified", "unverified", "not reset", "caching off")) == [
        "Cold starts: 1 of 5 points of arms with a cache failed: their prefix cache still held the probe after the "
        "reset or new salt (`--resume` runs them again).",
        "Cold starts: 2 of 5 points of arms with a cache could not be proven cold: the probe saw no cache hits on "
        "this engine (cached tokens not reported?).",
        "Cold starts: 1 of 5 points of arms with a cache ran without a reset (the server has no reset endpoint) and "
        "may have started warm; `sweep.cache_isolation: salt` isolates them."]


def test_compare_flags_the_study_whose_reset_did_not_take(tmp_path, monkeypatch):
    sweep = {"sweep.rates": [25, 50, 100]}
    good = run_study(cfg_with(out=str(tmp_path / "good"), **sweep), progress=False)

    async def second_reset_does_nothing(self):
        self.resets = getattr(self, "resets", 0) + 1
        if self.resets != 2:
            self.cache.clear()

    monkeypatch.setattr(EchoEngine, "reset_prefix_cache", second_reset_does_nothing)
    bad = run_study(cfg_with(out=str(tmp_path / "bad"), study="bad", **sweep), progress=False)
    monkeypatch.undo()
    assert [(p["mode"], p["rate"], p["status"]) for p in load(bad).manifest["points"] if p["status"] != "ok"] == [
        ("on", 50.0, "failed")]
    text = (build_compare([good, bad], tmp_path / "cmp", n_boot=20).parent / "report.md").read_text()
    flag = ("Cold starts: 1 of 3 points of arms with a cache failed: their prefix cache still held the probe after "
            "the reset or new salt (`--resume` runs them again).")
    assert text.count(flag) == 1 and text.count("Cold starts:") == 1
