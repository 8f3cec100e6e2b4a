"""The http backend's SGLang profile (``engine.server: sglang``) against a stub of SGLang's
documented API, not a real SGLang (none runs here):

* ``POST /v1/completions`` with token-id prompts, streamed; ``usage.prompt_tokens_details.cached_tokens``
  only with ``--enable-cache-report``;
* ``POST /flush_cache``: 400 while requests run, 200 once idle;
* ``GET /metrics`` (``--enable-metrics``): ``sglang:prompt_tokens_total`` and ``sglang:cached_tokens_total``;
* ``GET /health``, ``GET /v1/models``.

The stub's cache is a radix cache of page size 1: a prompt hits the longest prefix it shares with an
earlier prompt, never the whole prompt (the last token is always computed).
"""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from aiohttp import web

from prefixstudy.engines.base import RequestTrace
from prefixstudy.engines.http import HttpEngine, HttpEngineConfig


class StubSGLang:
    def __init__(self, *, radix: bool = True, cache_report: bool = True, token_delay_s: float = 0.0):
        self.radix, self.cache_report, self.delay = radix, cache_report, token_delay_s
        self.prompts: list[list[int]] = []
        self.running = 0
        self.prompt_tokens = self.cached_tokens = 0
        self.flushes = {200: 0, 400: 0}
        self.bodies: list[dict] = []

    def _cached(self, prompt: list[int]) -> int:
        best = 0
        for p in self.prompts if self.radix else ():
            n = 0
            for a, b in zip(p, prompt, strict=False):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        return min(best, len(prompt) - 1)

    async def completions(self, request):
        body = await request.json()
        self.bodies.append(body)
        prompt = body["prompt"]
        assert isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)
        self.running += 1
        try:
            cached = self._cached(prompt)
            self.prompts.append(list(prompt))
            self.prompt_tokens += len(prompt)
            self.cached_tokens += cached
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for _ in range(body["max_tokens"]):
                await asyncio.sleep(self.delay)
                chunk = {"id": "x", "object": "text_completion", "choices": [{"index": 0, "text": "t", "logprobs": None,
                                                                                "finish_reason": None}]}
                await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
            usage = {"prompt_tokens": len(prompt), "completion_tokens": body["max_tokens"],
                     "total_tokens": len(prompt) + body["max_tokens"]}
            if self.cache_report:
                usage["prompt_tokens_details"] = {"cached_tokens": cached}
            await resp.write(f"data: {json.dumps({'id': 'x', 'choices': [], 'usage': usage})}\n\n".encode())
            await resp.write(b"data: [DONE]\n\n")
            return resp
        finally:
            self.running -= 1

    async def flush_cache(self, request):
        if self.running:
            self.flushes[400] += 1
            return web.Response(status=400, text="Cache not flushed. Please check if there are running requests.")
        self.prompts.clear()
        self.flushes[200] += 1
        return web.Response(text="Cache flushed.\n")

    async def health(self, request):
        return web.Response(text="")

    async def models(self, request):
        return web.json_response({"data": [{"id": "stub"}]})

    async def metrics(self, request):
        return web.Response(text="# HELP sglang:prompt_tokens_total Number of prefill tokens processed.\n"
                                 "# TYPE sglang:prompt_tokens_total counter\n"
                                 f'sglang:prompt_tokens_total{{model_name="stub"}} {float(self.prompt_tokens)}\n'
                                 "# TYPE sglang:cached_tokens_total counter\n"
                                 f'sglang:cached_tokens_total{{model_name="stub"}} {float(self.cached_tokens)}\n')

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/flush_cache", self.flush_cache)
        app.router.add_post("/v1/completions", self.completions)
        return app


class Serving:
    """Stubs served from a thread of their own, so a study's own event loop can reach them."""

    def __init__(self, *stubs: StubSGLang):
        self.stubs, self.urls = stubs, []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        self.runners = [asyncio.run_coroutine_threadsafe(self._serve(s), self.loop).result(10) for s in self.stubs]
        return self

    async def _serve(self, stub):
        runner = web.AppRunner(stub.app())
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        self.urls.append(f"http://127.0.0.1:{runner.addresses[0][1]}")
        return runner

    def __exit__(self, *exc):
        for r in self.runners:
            asyncio.run_coroutine_threadsafe(r.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


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
    from prefixstudy.study import run_study

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
