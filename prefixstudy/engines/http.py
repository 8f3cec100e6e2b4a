"""Backend ``http``: any running OpenAI-compatible server, one base URL per arm.

Each request streams ``POST /v1/completions`` with the prompt as token ids, ``ignore_eos`` and
``max_tokens = min_tokens`` = the output length, so every mode generates exactly the dataset's
tokens.  Token times are taken on the client clock when each chunk arrives (as ``vllm bench
serve`` does); cached prompt tokens come from ``usage.prompt_tokens_details.cached_tokens`` when
the server reports them.  The server has no per-request engine stamps over HTTP, so queue /
prefill / decode per request are NaN; the server's own view comes from its Prometheus
``/metrics``, scraped before and after each point's measured requests (``engines.server_metrics``),
into the ``server_*`` summary columns.  No step-level iterations come over HTTP.

``engine.server`` names the server's API (``PROFILES``): ``vllm`` (reset through
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
from typing import Any, Literal, NamedTuple

from pydantic import Field, field_validator, model_validator

from prefixstudy.engines import server_metrics
from prefixstudy.engines.base import EngineConfigBase, EngineDefaults, IterationSample, RequestTrace
from prefixstudy.errors import UserError

log = logging.getLogger(__name__)

DEFAULT_BLOCK_SIZE = 16  # vLLM's GPU default, assumed only when the server does not say


class ServerProfile(NamedTuple):
    """What differs between the servers the http backend measures (``engine.server``)."""

    reset_path: str  # POST here resets the prefix cache
    reset_busy_status: int | None  # the reset's answer while requests run (None: a success flag in the body)
    block_size: int | None  # the prefix cache's unit when the server does not report it (None: DEFAULT_BLOCK_SIZE, warned)
    cached_tokens_flag: str  # what makes it report usage.prompt_tokens_details.cached_tokens
    reset_flag: str  # what makes it expose the reset endpoint
    # Fields added to every completion request.  vLLM's return_token_ids puts each event's token ids
    # in the stream, so tokens it sends several to an event (a loaded server) are counted where they
    # arrived, not taken from usage at the end.
    payload: dict[str, Any] = {}


# SGLang's, from its sources (not run against a real SGLang here): /flush_cache answers 400 while
# requests run; its radix cache matches single tokens (page size 1) unless --page-size says otherwise.
PROFILES = {
    # reset_external: the KV connector's cache too (a CPU tier), else a point starts on the last one's.
    "vllm": ServerProfile("/reset_prefix_cache?reset_external=true", None, None, "--enable-prompt-tokens-details",
                          "VLLM_SERVER_DEV_MODE=1", {"return_token_ids": True}),
    "sglang": ServerProfile("/flush_cache", 400, 1, "--enable-cache-report", "a release with /flush_cache"),
}
KEEPALIVE_S = 3.0  # < VLLM_HTTP_TIMEOUT_KEEP_ALIVE (5 s), the server's idle-connection timeout


class HttpEngineConfig(EngineConfigBase):
    """A running server per mode.  ``block_size``: the server's prefix-cache block (for the
    expected cached tokens); unset, it is read from vLLM's /metrics."""

    kind: Literal["http"] = Field("http", description="Running OpenAI-compatible servers, one base URL per arm.")
    targets: dict[str, str] = Field(default_factory=dict, description="Arm name (on, off, ...) -> the base URL of "
                                    "its server (`--target-on` / `--target-off`).")
    served_model: str | None = Field(None, description="The requests' `model`; None: the first of the server's "
                                     "/v1/models.")
    server: Literal["vllm", "sglang"] = Field("vllm", description="The server's API (engines.http.PROFILES): how "
                                              "its cache is reset, reports cached tokens and counts them.")
    reset_path: str | None = Field(None, description="POST here resets the prefix cache; None: the server's "
                                   "(vllm: /reset_prefix_cache, sglang: /flush_cache).")
    reset_timeout_s: float = Field(60.0, gt=0, description="Seconds a reset keeps asking while the previous "
                                   "point's requests finish.")
    metrics_path: str | None = Field("/metrics", description="Prometheus text scraped before and after each "
                                     "point (the `server_*` summary columns); None: not scraped.")
    health_timeout_s: float = Field(60.0, gt=0, description="Seconds to wait at start for GET /health to "
                                    "answer.")
    max_num_seqs: int | None = Field(None, gt=0, description="The server's own `max_num_seqs` (SGLang: "
                                     "`max_running_requests`), when known: with it a point is saturated once the "
                                     "server ran full; None: a trend test on the requests in flight decides "
                                     "(weaker, docs/saturation.md).")

    @property
    def admission_limit(self) -> int | None:
        return self.max_num_seqs

    @field_validator("targets", mode="before")
    @classmethod
    def _yaml_on_off(cls, v):
        # YAML 1.1 reads a bare `on:` / `off:` key as true / false; the user meant the mode.
        if isinstance(v, dict):
            return {({True: "on", False: "off"}.get(k, k) if isinstance(k, bool) else k): u for k, u in v.items()}
        return v

    @model_validator(mode="after")
    def _profile_reset_path(self) -> "HttpEngineConfig":
        if self.reset_path is None:
            self.reset_path = PROFILES[self.server].reset_path
        return self

    @field_validator("targets")
    @classmethod
    def _urls(cls, v: dict[str, str]) -> dict[str, str]:
        from urllib.parse import urlsplit

        for mode, url in v.items():
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"{mode}: {url!r} is not an http:// or https:// base URL")
            try:
                parts = urlsplit(url)
                parts.port  # noqa: B018 (a port that is no number raises here)
            except ValueError:
                raise ValueError(f"{mode}: {url!r} has no valid host and port") from None
            if not parts.hostname:
                raise ValueError(f"{mode}: {url!r} has no host")
        return {m: u.rstrip("/") for m, u in v.items()}


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

    async def reset_prefix_cache(self) -> None:
        if not self.reset_supported:
            return
        url = f"{self.base}{self.config.reset_path}"
        # Requests of the previous point may still be finishing; the server refuses until idle (vLLM:
        # {"success": false}; SGLang: HTTP 400), so ask again until the deadline.
        deadline = time.monotonic() + self.config.reset_timeout_s
        busy = self.profile.reset_busy_status
        while True:
            async with await self._idempotent("post", url) as r:
                if r.status in (404, 405):
                    self.reset_supported = False
                    log.warning("warning: %s has no %s (start it with %s); the prefix cache is NOT reset between "
                                "points, so a point can hit what an earlier one cached",
                                self.base, self.config.reset_path, self.profile.reset_flag)
                    return
                body = await r.text()
            if r.status == 200 and '"success":false' not in body.replace(" ", ""):
                return
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
        self._no_cached_field = self._unstreamed = 0
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

    # ------------------------------------------------------------------ requests
    def _payload(self, prompt_token_ids: list[int], output_len: int) -> dict[str, Any]:
        return {"model": self.model_name, "prompt": prompt_token_ids, "max_tokens": output_len,
                "min_tokens": output_len, "ignore_eos": True, "temperature": 0.0, "stream": True,
                "stream_options": {"include_usage": True}, **self.profile.payload}

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
        if cached is None:
            self._no_cached_field += 1
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
