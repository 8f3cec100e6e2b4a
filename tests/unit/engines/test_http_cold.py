"""Cold starts over HTTP, against a stand-in of vLLM's API with a real block cache
(``cachesim.BlockCache``, salted by the request's ``cache_salt`` as vLLM's is): a server whose
reset answers 200 but empties nothing fails every caching point; ``cache_isolation: salt`` isolates
points on a server with no reset endpoint; a server that reports no cached tokens leaves the
probe unverified, said once.  The real `vllm serve` is in tests/integration/test_cache_salt.py."""

from __future__ import annotations

import json
import logging

from aiohttp import web

from prefixstudy.engines.cachesim import BlockCache
from prefixstudy.config import load_config
from prefixstudy.results import load
from prefixstudy.study.orchestrate import run_study
from tests.unit.engines.test_sglang import Serving


class StandIn:
    """vLLM's completions API over a block cache of 16-token blocks."""

    def __init__(self, *, caching: bool = True, ignores_reset: bool = False, reset: bool = True,
                 reports_cached: bool = True):
        self.caching, self.ignores_reset, self.reset, self.reports_cached = caching, ignores_reset, reset, reports_cached
        self.cache = BlockCache(16)
        self.resets = 0
        self.salts: list[str | None] = []

    async def completions(self, request):
        body = await request.json()
        prompt, n = body["prompt"], body["max_tokens"]
        self.salts.append(body.get("cache_salt"))
        cached = self.cache.run(prompt, None, n, body.get("cache_salt", "")) if self.caching else 0
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(n):
            event = {"choices": [{"index": 0, "text": "", "token_ids": [7]}]}
            await resp.write(f"data: {json.dumps(event)}\n\n".encode())
        usage = {"prompt_tokens": len(prompt), "completion_tokens": n}
        if self.reports_cached:
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n".encode())
        return resp

    async def reset_cache(self, request):
        self.resets += 1
        if not self.ignores_reset:
            self.cache.clear()
        return web.json_response({"success": True})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", _ok)
        app.router.add_get("/v1/models", _models)
        if self.reset:
            app.router.add_post("/reset_prefix_cache", self.reset_cache)
        app.router.add_post("/v1/completions", self.completions)
        return app


async def _ok(request):
    return web.Response(text="")


async def _models(request):
    return web.json_response({"data": [{"id": "stand-in"}]})


def _study(tmp_path, on: StandIn, off: StandIn, **sets):
    with Serving(on, off) as s:
        cfg = load_config(None, {"engine": {"kind": "http", "block_size": 16, "metrics_path": None,
                                            "targets": {"on": s.urls[0], "off": s.urls[1]}},
                                 "executor": "local", "out": str(tmp_path), "arrivals.process": "constant",
                                 "dataset.prefix_len": 40, "dataset.suffix_len": 8, "dataset.output_len": 4,
                                 "sweep.rates": [50], "sweep.repeats": 2, "sweep.num_requests": 6,
                                 # No engine warm-up: the tests count every request a server gets.
                                 "sweep.warmup_requests": 1, "sweep.engine_warmup.max_batches": 0, **sets})
        return load(run_study(cfg, progress=False))


def test_a_server_whose_reset_answers_200_but_empties_nothing_fails_every_caching_point(tmp_path):
    on, off = StandIn(ignores_reset=True), StandIn(caching=False)
    res = _study(tmp_path, on, off)
    pts = res.manifest["points"]
    assert [(p["mode"], p["status"], p["cold_probe"]) for p in pts] == [
        ("on", "failed", "warm"), ("off", "ok", "caching off"), ("off", "ok", "caching off"), ("on", "failed", "warm")]
    assert {p["error"] for p in pts if p["mode"] == "on"} == {
        "cold-start probe: the prefix-cache reset did not take: a fresh 33-token probe hit 32 cached tokens before "
        "the reset and 32 after it (0 expected)"}
    assert on.resets == 2 and off.resets == 2  # it was asked, and said yes, before each point
    assert res.manifest["status"] == "complete_with_failures"


def test_salt_isolates_points_on_a_server_with_no_reset_endpoint(tmp_path):
    on, off = StandIn(reset=False), StandIn(caching=False, reset=False)
    res = _study(tmp_path, on, off, **{"sweep.cache_isolation": "salt"})
    pts = {(p["mode"], p["repeat"]): p for p in res.manifest["points"]}
    assert [(k, p["status"], p["cold_probe"], p.get("probe_cold_cached_tokens")) for k, p in sorted(pts.items())] == [
        (("off", 0), "ok", "caching off", None), (("off", 1), "ok", "caching off", None),
        (("on", 0), "ok", "cold", 0), (("on", 1), "ok", "cold", 0)]
    # ON's requests: the probe's 2 sends under no salt yet, its send after under repeat 0's salt, then
    # the point's prime, warm-up and 6 measured requests under it; then repeat 1 likewise.
    s0, s1 = pts[("on", 0)]["cache_salt"], pts[("on", 1)]["cache_salt"]
    assert on.salts == [None, None] + [s0] * 9 + [s0, s0] + [s1] * 9
    m = res.measured
    assert m[m["mode"] == "on"]["num_cached_tokens"].tolist() == [32] * 12  # the prime's blocks, under its salt
    assert bool(res.summary["hit_rate_ok"].all())


def test_a_server_that_reports_no_cached_tokens_leaves_the_probe_unverified_said_once(tmp_path, caplog):
    on, off = StandIn(reports_cached=False), StandIn(caching=False)
    with caplog.at_level(logging.WARNING):
        res = _study(tmp_path, on, off)
    on_pts = [p for p in res.manifest["points"] if p["mode"] == "on"]
    assert [(p["status"], p["cold_probe"], p["probe_warm_cached_tokens"], p["probe_cold_cached_tokens"])
            for p in on_pts] == [("ok", "unverified", None, None)] * 2
    said = [r.getMessage() for r in caplog.records if "cold-start probe" in r.getMessage()]
    assert said == ["warning: cache ON: the cold-start probe sees no cache hits here, so its reset is not verified "
                    "(manifest: cold_probe)"]
