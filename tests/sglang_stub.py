"""A stand-in for SGLang's server: its documented API, not a real SGLang (none runs here).

* ``POST /v1/completions`` with token-id prompts, streamed; ``usage.prompt_tokens_details.cached_tokens``
  only with ``--enable-cache-report``, and null when nothing was cached (as SGLang's UsageProcessor);
* ``POST /flush_cache``: 400 while requests run, 200 once idle;
* ``GET /metrics`` (``--enable-metrics``): ``sglang:prompt_tokens_total`` and ``sglang:cached_tokens_total``;
* ``GET /health``, ``GET /v1/models``; and ``GET /stub/argv``, the command line it was launched with.

Its cache is a radix cache of page size 1: a prompt hits the longest prefix it shares with an
earlier prompt, never the whole prompt (the last token is always computed).

Served from a thread (``Serving``) for the http backend's tests, or launched as SGLang's server
would be (``python -m tests.sglang_stub --port N [--disable-radix-cache] ...``, through
``PREFIXSTUDY_SGLANG_SERVER_MODULE``) for the sglang-server backend's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading

from aiohttp import web


class StubSGLang:
    def __init__(self, *, radix: bool = True, cache_report: bool = True, token_delay_s: float = 0.0,
                 metrics: bool = True, args: list[str] | None = None):
        self.radix, self.cache_report, self.delay, self.metrics_on = radix, cache_report, token_delay_s, metrics
        self.args = args or []  # the command line it was launched with (GET /stub/argv)
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
            # SGLang leaves the details null when nothing was cached ("keeps JSON slim").
            usage["prompt_tokens_details"] = {"cached_tokens": cached} if self.cache_report and cached else None
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
        if not self.metrics_on:  # SGLang serves /metrics only with --enable-metrics
            return web.Response(status=404)
        return web.Response(text="# HELP sglang:prompt_tokens_total Number of prefill tokens processed.\n"
                                 "# TYPE sglang:prompt_tokens_total counter\n"
                                 f'sglang:prompt_tokens_total{{model_name="stub"}} {float(self.prompt_tokens)}\n'
                                 "# TYPE sglang:cached_tokens_total counter\n"
                                 f'sglang:cached_tokens_total{{model_name="stub"}} {float(self.cached_tokens)}\n')

    async def argv(self, request):
        return web.json_response(self.args)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/stub/argv", self.argv)
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


def main(argv: list[str]) -> None:
    """Start as ``sglang.launch_server`` would, from its flags (the others are accepted and kept)."""
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--disable-radix-cache", action="store_true")
    p.add_argument("--enable-cache-report", action="store_true")
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--stub-token-delay-s", type=float, default=0.0)
    a, _ = p.parse_known_args(argv)
    stub = StubSGLang(radix=not a.disable_radix_cache, cache_report=a.enable_cache_report,
                      token_delay_s=a.stub_token_delay_s, metrics=a.enable_metrics, args=argv)
    web.run_app(stub.app(), host=a.host, port=a.port, print=None)


if __name__ == "__main__":
    main(sys.argv[1:])
