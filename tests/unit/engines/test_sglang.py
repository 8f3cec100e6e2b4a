"""The http backend's SGLang profile (``engine.server: sglang``) against the stand-in of SGLang's
documented API (tests/sglang_stub.py), not a real SGLang (none runs here)."""

from __future__ import annotations

import asyncio

import pytest

from prefixstudy.engines.base import RequestTrace
from prefixstudy.engines.http import HttpEngine, HttpEngineConfig
from tests.sglang_stub import Serving, StubSGLang


def test_the_profile_sets_the_reset_path_and_the_block_size():
    assert HttpEngineConfig(server="sglang").reset_path == "/flush_cache"
    assert HttpEngineConfig().reset_path == "/reset_prefix_cache?reset_external=true"  # the CPU tier too
    assert HttpEngineConfig(server="sglang", reset_path="/mine").reset_path == "/mine"


def test_a_reset_while_requests_run_is_asked_again_until_the_server_is_idle():
    stub = StubSGLang(token_delay_s=0.05)

    async def go(url):
        e = HttpEngine("m", HttpEngineConfig(server="sglang", targets={"on": url}), "on")
        await e.start()
        assert (e.block_size, e.model_name) == (1, "stub")  # SGLang's page size; no warning to give
        try:
            req = asyncio.ensure_future(e.generate(list(range(100, 140)), 8, "r0", RequestTrace(0.0)))
            while not stub.running:
                await asyncio.sleep(0.01)
            await e.reset_prefix_cache()  # 400 while r0 streams its 8 tokens (~0.4 s), then 200
            assert req.done()
            return req.result()
        finally:
            await e.aclose()

    with Serving(stub) as s:
        tr = asyncio.run(go(s.urls[0]))
    assert len(tr.token_times) == 8 and tr.error == ""
    assert stub.flushes[400] >= 1 and stub.flushes[200] == 1
    assert stub.prompts == []


def test_a_reset_that_never_finds_the_server_idle_fails_at_its_deadline():
    stub = StubSGLang(token_delay_s=0.5)

    async def go(url):
        e = HttpEngine("m", HttpEngineConfig(server="sglang", targets={"on": url}, reset_timeout_s=0.3), "on")
        await e.start()
        try:
            req = asyncio.ensure_future(e.generate(list(range(100, 140)), 8, "r0", RequestTrace(0.0)))
            while not stub.running:
                await asyncio.sleep(0.01)
            with pytest.raises(RuntimeError, match=r"/flush_cache refused to reset the prefix cache for 0.3 s"):
                await e.reset_prefix_cache()
            req.cancel()
        finally:
            await e.aclose()

    with Serving(stub) as s:
        asyncio.run(go(s.urls[0]))
    assert stub.flushes[200] == 0 and stub.flushes[400] >= 2


@pytest.mark.slow
def test_a_study_against_sglang_reads_cached_tokens_and_counters(tmp_path):
    from prefixstudy.config import load_config
    from prefixstudy.results import load
    from prefixstudy.study.orchestrate import run_study

    on, off = StubSGLang(), StubSGLang(radix=False)  # OFF: SGLang's --disable-radix-cache
    with Serving(on, off) as s:
        cfg = load_config(None, {"engine": {"kind": "http", "server": "sglang", "targets": {"on": s.urls[0], "off": s.urls[1]}},
                                 "executor": "local", "out": str(tmp_path), "dataset.prefix_len": 56,
                                 "dataset.suffix_len": 8, "dataset.output_len": 4, "dataset.groups": 2,
                                 "sweep.rates": [20], "sweep.num_requests": 8, "sweep.warmup_requests": 1})
        res = load(run_study(cfg, progress=False))
    r = res.measured
    assert (r["error"] == "").all() and len(r) == 16
    assert set(on.bodies[0]) >= {"prompt", "max_tokens", "min_tokens", "ignore_eos", "stream"}
    assert "return_token_ids" not in on.bodies[0]  # vLLM's field; SGLang's API has no such one
    ron, roff = r[r["mode"] == "on"], r[r["mode"] == "off"]
    # Page size 1: the 56 shared tokens (more where two unique suffixes happen to start alike), as
    # the client's own estimate replays it; OFF none.
    assert (ron["num_cached_tokens"] >= 56).all()
    assert ron["num_cached_tokens"].tolist() == ron["expected_cached_tokens"].tolist()
    assert roff["num_cached_tokens"].tolist() == [0] * 8
    s = res.summary.set_index("mode")
    # The counters' deltas cover exactly the measured requests (scraped before and after them).
    assert s.loc["on", "server_prefix_hits"] == ron["num_cached_tokens"].sum()
    assert s.loc["on", "server_prefix_queries"] == ron["prompt_tokens"].sum() == 8 * 64
    assert s.loc["off", "server_prefix_hits"] == 0
    assert bool(s.loc["on", "hit_rate_ok"]) and bool(s.loc["off", "hit_rate_ok"])
    assert on.flushes[200] >= 1 and off.flushes[200] >= 1  # reset before the point
    pts = {p["mode"]: p for p in res.manifest["points"]}
    assert pts["on"]["cached_tokens_reported"] is True and pts["on"]["block_size"] == 1
    assert pts["off"]["cached_tokens_reported"] is True  # all null, as SGLang leaves them, and no hits counted


async def two_requests(url: str, mode: str):
    """Two requests sharing 40 prompt tokens, as one point of the arm ``mode``: their traces and the
    point's metadata."""
    e = HttpEngine("m", HttpEngineConfig(server="sglang", targets={mode: url}), mode)
    await e.start()
    try:
        await e.begin_point()
        traces = [await e.generate(list(range(100, 140)) + [500 + i], 2, f"r{i}", RequestTrace(0.0))
                  for i in range(2)]
        return traces, await e.end_point()
    finally:
        await e.aclose()


@pytest.mark.parametrize(("radix", "cache_report", "reported"), [
    (True, True, True),  # the second request reports its hit: the first one's null was 0
    (False, True, True),  # nulls only, and the counter agrees nothing was cached
    (True, False, False),  # nulls only while the counter shows hits: the server reports no cached tokens
])
def test_sglang_s_null_details_are_zero_unless_its_counters_show_hits(radix, cache_report, reported):
    stub = StubSGLang(radix=radix, cache_report=cache_report)

    with Serving(stub) as s:
        traces, meta = asyncio.run(two_requests(s.urls[0], "on"))
    assert [t.num_cached_tokens for t in traces] == [0, 40 if radix and cache_report else 0]
    assert meta["server_prefix_hits"] == (40 if radix else 0)
    assert meta["cached_tokens_reported"] is reported


def test_the_off_arm_s_nulls_are_zero_without_a_counter_to_say_so(caplog):
    """Radix off, no /metrics (nothing to confirm that nothing was cached): the arm's cache is off,
    so its nulls are 0 and no warning says the server does not report them."""
    with Serving(StubSGLang(radix=False, metrics=False)) as s, caplog.at_level("WARNING"):
        traces, meta = asyncio.run(two_requests(s.urls[0], "off"))
    assert [t.num_cached_tokens for t in traces] == [0, 0]
    assert (meta["server_metrics"], meta["cached_tokens_reported"]) == (False, True)
    assert "did not report" not in caplog.text
