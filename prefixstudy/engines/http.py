"""Backend ``http``: any running OpenAI-compatible server, one base URL per arm.

Each request streams ``POST /v1/completions`` with the prompt as token ids, ``ignore_eos`` and
``max_tokens = min_tokens`` = the output length, so every mode generates exactly the dataset's
tokens.  Token times are taken on the client clock when each chunk arrives (as ``vllm bench
serve`` does); cached prompt tokens come from ``usage.prompt_tokens_details.cached_tokens`` when
the server reports them.  The server has no per-request engine stamps over HTTP, so queue /
prefill / decode per request are NaN; the server's own view comes from its Prometheus
``/metrics``, scraped before and after each point's measured requests (``engines.server_metrics``),
into the ``server_*`` summary columns.  No step-level iterations come over HTTP.

``engine.server`` names the server's API (``http_config.PROFILES``): ``vllm`` (reset through
/reset_prefix_cache in dev mode, cached tokens with --enable-prompt-tokens-details, the vllm:
counters) or ``sglang`` (reset through /flush_cache, which answers 400 while requests run, so it is
asked again until idle or ``reset_timeout_s``; cached tokens with --enable-cache-report; the
counters sglang:prompt_tokens_total and sglang:cached_tokens_total with --enable-metrics).  The
SGLang profile follows SGLang's sources and is tested against a stub of that API only.

One aiohttp session per engine: connections are pooled and kept alive, never set up per request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from typing import Any

from prefixstudy.engines import server_metrics
from prefixstudy.engines.base import EngineDefaults, IterationSample, RequestTrace, caching
from prefixstudy.engines.http_config import PROFILES, HttpEngineConfig
from prefixstudy.errors import UserError

log = logging.getLogger(__name__)

DEFAULT_BLOCK_SIZE = 16  # vLLM's GPU default, assumed only when the server does not say
KEEPALIVE_S = 3.0  # < VLLM_HTTP_TIMEOUT_KEEP_ALIVE (5 s), the server's idle-connection timeout


def _check_reachable(mode: str, url: str) -> None:
    """Before any results folder exists: something must answer at the URL (a server still loading
    may answer /health with an error; start() waits for it to become healthy)."""
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(f"{url}/health", timeout=5).close()
    except urllib.error.HTTPError:
        pass  # it answers
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise UserError(f"field 'engine.targets.{mode}': nothing answers at {url} ({reason})") from None


def _first_line(text: str, limit: int = 200) -> str:
    lines = text.strip().splitlines()
    return lines[0][:limit] if lines else ""


class ServerReplyError(Exception):
    """A reply that is not a completion stream; its text is the request's error, as is."""


async def _refusal(r) -> str:
    """The error of a reply that is not a completion stream, in one line ("" for a stream): an HTTP
    error, a redirect, or a 200 that is not server-sent events (an HTML login page, a JSON body)."""
    if 300 <= r.status < 400:
        return f"HTTP {r.status}: redirected to {r.headers.get('Location', '?')}; give the server's own base URL"
    if r.status != 200:
        return f"HTTP {r.status}: {_first_line(await r.text())}"
    ctype = r.headers.get("Content-Type", "")
    if not ctype.startswith("text/event-stream"):
        return f"not an SSE stream (Content-Type {ctype or 'none'}): {_first_line(await r.text(errors='replace'))}"
    return ""


class HttpEngine(EngineDefaults):
    """One mode's server, reached over HTTP.  start → (reset / point / generate)* → shutdown."""

    kind = "http"

    def __init__(self, model: str, engine: HttpEngineConfig, mode: str, *, ray_workers: bool = False,
                 base_url: str | None = None):
        self.config, self.mode = engine, mode
        self.profile = PROFILES[engine.server]
        self.base = (base_url or engine.targets.get(mode, "")).rstrip("/")
        self.model_name = engine.served_model
        self.block_size = engine.block_size or 0
        self.num_blocks = 0  # KV-cache blocks, from the server's /metrics once started (0: unknown)
        self.startup_s = math.nan
        self.session = None
        self.reset_supported = True
        self.dead = False
        self._before: dict[str, float] = {}
        self._no_cached_field = 0  # requests this point whose usage had no cached_tokens
        self._null_details = 0  # of those, nulls from a server that leaves them null when nothing was cached
        self._requests = 0  # requests this point whose usage was read
        self._unstreamed = 0  # requests this point whose usage counted more tokens than streamed
        self.alive = None  # callable: False once a server this engine launched has exited (vllm-server)

    # ------------------------------------------------------------------ checks and provenance
    @classmethod
    def check_config(cls, model: str, engine: HttpEngineConfig, modes: list[str]) -> None:
        for mode in modes:
            if mode not in engine.targets:
                raise UserError(f"field 'engine.targets.{mode}': no server URL for caching {mode.upper()} "
                                f"(set it, or --target-{mode})")
        for mode in modes:
            _check_reachable(mode, engine.targets[mode])

    @classmethod
    def versions(cls) -> dict[str, Any]:
        return {}

    @classmethod
    def process_env(cls, engine: HttpEngineConfig, mode: str, use_gpu: bool) -> dict[str, str]:
        return {}

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        import aiohttp

        t0 = time.monotonic()
        # No connection limit (requests are never queued in the client); idle connections are kept for
        # KEEPALIVE_S, under vLLM's (uvicorn's) 5 s: the client drops an idle connection before the
        # server closes it, so a request never goes out on a connection the server is closing (seen:
        # ServerDisconnectedError on the reset after a point, with a 300 s client keep-alive).
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S, force_close=False)
        self.session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None))
        await self.wait_healthy(self.config.health_timeout_s, self.alive)
        if self.model_name is None:
            self.model_name = await self._served_model()
        text = await self._metrics_text()
        self.num_blocks = server_metrics.num_blocks(text) if text else 0
        if not self.block_size:
            size = (server_metrics.block_size(text) if text else None) or self.profile.block_size
            if size is None:
                log.warning("warning: %s does not report its prefix-cache block size; expected cached tokens "
                            "assume %d (set engine.block_size)", self.base, DEFAULT_BLOCK_SIZE)
            self.block_size = size or DEFAULT_BLOCK_SIZE
        self.startup_s = time.monotonic() - t0

    async def wait_healthy(self, timeout_s: float, alive=None) -> None:
        """Poll GET /health until 200.  ``alive``: callable, False once the server's process is gone."""
        deadline, last = time.monotonic() + timeout_s, "no answer"
        while time.monotonic() < deadline:
            if alive is not None and not alive():
                raise RuntimeError(f"server for caching {self.mode.upper()} exited before it was healthy")
            try:
                async with self.session.get(f"{self.base}/health") as r:
                    if r.status == 200:
                        return
                    last = f"HTTP {r.status}"
            except Exception as e:  # noqa: BLE001 - not listening yet: any error means not healthy yet, the deadline decides
                last = type(e).__name__
            await asyncio.sleep(0.5)
        hint = (f"; the base URL is the server's root, without /v1: {self.base.removesuffix('/v1')}"
                if self.base.endswith("/v1") else "")
        raise UserError(f"field 'engine.targets.{self.mode}': {self.base} not healthy after {timeout_s:g} s ({last}){hint}")

    async def _served_model(self) -> str:
        async with self.session.get(f"{self.base}/v1/models") as r:
            data = await r.json(content_type=None) if r.status == 200 else {}
        models = [m.get("id") for m in (data or {}).get("data", []) if isinstance(m, dict)]
        if not models:
            raise UserError(f"field 'engine.served_model': {self.base}/v1/models lists no model; name it")
        return str(models[0])

    async def _idempotent(self, method: str, url: str):
        """A control request (reset, metrics), sent again once if the connection dropped under it:
        unlike a measured request, repeating it changes nothing."""
        import aiohttp

        try:
            return await self.session.request(method, url)
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
            return await self.session.request(method, url)

    async def _metrics_text(self) -> str | None:
        if not self.config.metrics_path:
            return None
        try:
            async with await self._idempotent("get", f"{self.base}{self.config.metrics_path}") as r:
                return await r.text() if r.status == 200 else None
        except Exception:  # noqa: BLE001 - metrics are best effort: unreadable metrics are None
            return None

    async def reset_prefix_cache(self) -> bool:
        """True once reset; False where the server has no reset endpoint (warned the first time)."""
        if not self.reset_supported:
            return False
        url = f"{self.base}{self.config.reset_path}"
        # Requests of the previous point may still be finishing; the server refuses until idle (vLLM:
        # {"success": false}; SGLang: HTTP 400), so ask again until the deadline.
        deadline = time.monotonic() + self.config.reset_timeout_s
        busy = self.profile.reset_busy_status
        while True:
            async with await self._idempotent("post", url) as r:
                if r.status in (404, 405):
                    self.reset_supported = False
                    salt = ", or isolate the points with sweep.cache_isolation: salt" if self.profile.cache_salt else ""
                    log.warning("warning: %s has no %s (start it with %s%s); the prefix cache is NOT reset between "
                                "points, so a point can hit what an earlier one cached",
                                self.base, self.config.reset_path, self.profile.reset_flag, salt)
                    return False
                body = await r.text()
            if r.status == 200 and '"success":false' not in body.replace(" ", ""):
                return True
            if busy is not None and r.status != busy:
                raise RuntimeError(f"{url} answered HTTP {r.status} to a prefix-cache reset: {_first_line(body)}")
            if time.monotonic() >= deadline:
                raise RuntimeError(f"{url} refused to reset the prefix cache for {self.config.reset_timeout_s:g} s "
                                   f"(requests still running?)")
            await asyncio.sleep(0.05)

    # ------------------------------------------------------------------ points
    def begin_iterations(self) -> None:
        pass

    def end_iterations(self) -> list[IterationSample]:
        return []  # a server has no step-level records over HTTP

    async def begin_point(self) -> None:
        """Scrape the counters just before the measured requests."""
        self._no_cached_field = self._null_details = self._unstreamed = self._requests = 0
        text = await self._metrics_text()
        self._before = server_metrics.counters(text, self.config.server) if text else {}

    async def end_point(self) -> dict[str, Any]:
        """The point's server-side deltas and what the server could not do, for the point's metadata."""
        text = await self._metrics_text()
        after = server_metrics.counters(text, self.config.server) if text else {}
        deltas = server_metrics.point_deltas(self._before, after)
        # None, not NaN, where the server has no such metric: the manifest is strict JSON.
        out: dict[str, Any] = {k: (None if math.isnan(v) else v) for k, v in deltas.items()}
        out["server_metrics"] = bool(self._before and after)
        self._no_cached_field -= self._null_details if self._nulls_mean_uncached(out) else 0
        out["cached_tokens_reported"] = self._no_cached_field == 0
        out["prefix_cache_reset"] = self.reset_supported
        out["requests_with_unstreamed_tokens"] = self._unstreamed
        if self._unstreamed:
            log.warning("warning: %s counted more completion tokens than it streamed for %d requests; "
                        "their token counts are the server's and their ITL is not measured (no token_ids "
                        "in its stream, several tokens an event)", self.base, self._unstreamed)
        if self._no_cached_field:
            log.warning("warning: %s did not report usage.prompt_tokens_details.cached_tokens for %d requests; "
                        "their num_cached_tokens is 0 (start it with %s)",
                        self.base, self._no_cached_field, self.profile.cached_tokens_flag)
        return out

    def _nulls_mean_uncached(self, deltas: dict[str, Any]) -> bool:
        """Whether this point's null cached-token details were 0 cached tokens: the server leaves
        them null when nothing was cached, and the arm's cache is off, or some request reported a
        count (reporting is on), or the server's own counter cached nothing either.  Nulls everywhere while the
        counter shows hits: the server reports none (started without its cache-report flag)."""
        if not self.profile.null_when_uncached or not self._null_details:
            return False
        if not caching(self.config, self.mode):  # the arm's cache is off: nothing can be cached
            return True
        if self._null_details < self._requests:
            return True
        hits = deltas.get("server_prefix_hits")
        return hits is not None and hits == 0

    # ------------------------------------------------------------------ requests
    def _payload(self, prompt_token_ids: list[int], output_len: int) -> dict[str, Any]:
        salt = {"cache_salt": self.cache_salt} if self.cache_salt else {}  # vLLM's per-request salt
        return {"model": self.model_name, "prompt": prompt_token_ids, "max_tokens": output_len,
                "min_tokens": output_len, "ignore_eos": True, "temperature": 0.0, "stream": True,
                "stream_options": {"include_usage": True}, **self.profile.payload, **salt}

    async def generate(self, prompt_token_ids: list[int], output_len: int, request_id: str,
                       trace: RequestTrace) -> RequestTrace:
        import aiohttp

        url = f"{self.base}/v1/completions"
        try:
            # A cancelled request closes its connection, and vLLM aborts it on the disconnect.
            # Redirects are not followed: a completion stream that moves (a login page, a proxy's
            # loop) is not the server asked for.
            async with self.session.post(url, json=self._payload(prompt_token_ids, output_len),
                                         headers={"X-Request-Id": request_id}, allow_redirects=False) as r:
                trace.error = await _refusal(r)
                if trace.error:
                    return trace
                try:
                    usage = await self._read_stream(r, trace)
                except ServerReplyError as e:
                    trace.error = str(e)
                    return trace
                except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError):
                    trace.error = f"connection closed mid-stream after {len(trace.token_times)} of {output_len} tokens"
                    return trace
        except aiohttp.ClientConnectorError:
            self.dead = True  # nothing listens there any more
            raise
        self._take_usage(usage, trace)
        return trace

    async def _read_stream(self, r, trace: RequestTrace) -> dict:
        """Server-sent events: one ``data: {json}`` per message, messages split by a blank line.
        A message with choices carries tokens (``token_ids`` when the server sends them, else one);
        the last carries ``usage``.  Returns the usage (empty if none came)."""
        buf, usage = b"", {}
        async for chunk in r.content.iter_any():
            now = time.monotonic()  # before parsing: the arrival time of every token in this chunk
            buf += chunk.replace(b"\r\n", b"\n")  # SSE allows CRLF line ends; a stray CR is stripped below
            *messages, buf = buf.split(b"\n\n")
            for msg in messages:
                data = msg.strip().removeprefix(b"data:").strip()
                if not data or data == b"[DONE]" or data.startswith(b":"):
                    continue
                try:
                    obj = json.loads(data)
                except ValueError:
                    raise ServerReplyError("invalid JSON in the stream: "
                                           f"{_first_line(data.decode(errors='replace'), 100)}") from None
                if not isinstance(obj, dict):
                    raise ServerReplyError("not an event object in the stream: "
                                           f"{_first_line(data.decode(errors='replace'), 100)}")
                if obj.get("error"):
                    raise ServerReplyError(f"server error: {_first_line(str(obj['error']))}")
                choices = obj.get("choices")
                if choices:
                    ids = choices[0].get("token_ids")
                    trace.token_times.extend([now] * (len(ids) if isinstance(ids, list) else 1))
                elif obj.get("usage"):
                    usage = obj["usage"]
        return usage

    def _take_usage(self, usage: dict, trace: RequestTrace) -> None:
        details = usage.get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        self._requests += 1
        if cached is None:
            self._no_cached_field += 1
            self._null_details += self.profile.null_when_uncached
            # A null from a server that leaves it null when nothing was cached is 0 cached tokens;
            # the warm probe (runner.cold) tells whether such a server reports them at all.
            trace.cached_tokens_reported = self.profile.null_when_uncached
        trace.num_cached_tokens = int(cached or 0)
        # A server that sends several tokens an event without token_ids: the count is the server's,
        # the last ones taken as arriving with the last event (E2E and TPOT hold; the gaps between
        # tokens are unknown, so the record leaves ITL unmeasured), and the point says how many.
        n = int(usage.get("completion_tokens") or 0)
        if trace.token_times and n > len(trace.token_times):
            trace.unstreamed_tokens = n - len(trace.token_times)
            trace.token_times.extend([trace.token_times[-1]] * trace.unstreamed_tokens)
            self._unstreamed += 1

    def is_dead(self) -> bool:
        return self.dead

    async def aclose(self) -> None:
        """Close the connection pool (the runner awaits this before ``shutdown``)."""
        if self.session is not None:
            await self.session.close()
        self.session = None

    def shutdown(self) -> None:
        # Without aclose (an executor that only calls shutdown): drop the pooled sockets now.
        # aiohttp's own close is a coroutine; its synchronous part is the connector's _close.
        if self.session is not None and self.session.connector is not None:
            self.session.connector._close()
        self.session = None
