"""Stage: engines (HTTP backends).  A server's Prometheus ``/metrics``, as per-point deltas.

The HTTP backends scrape the text format before and after the measured part of a point; the
difference of the cumulative counters is what the server did for exactly those requests.  What
comes out are the ``server_*`` columns of summary.csv (``schema.SERVER_COLUMNS``) and vLLM's cached
tokens by tier (``schema.TIER_COLUMNS``); a server that does not export a metric (not vLLM, or an
older vLLM) leaves its column NaN.
"""

from __future__ import annotations

import math
import re

# The cumulative series read, summed over label sets (one per engine / model name).  vLLM 0.26 and
# 0.32 use these names; earlier releases prefixed the cache counters with ``gpu_``.
SERIES = {
    "queries": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    "hits": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    "queue_sum": ("vllm:request_queue_time_seconds_sum",),
    "queue_count": ("vllm:request_queue_time_seconds_count",),
    "prefill_sum": ("vllm:request_prefill_time_seconds_sum",),
    "prefill_count": ("vllm:request_prefill_time_seconds_count",),
    "decode_sum": ("vllm:request_decode_time_seconds_sum",),
    "decode_count": ("vllm:request_decode_time_seconds_count",),
}

# SGLang (--enable-metrics): prompt tokens received and those its radix cache served.
SGLANG_SERIES = {
    "queries": ("sglang:prompt_tokens_total",),
    "hits": ("sglang:cached_tokens_total",),
}
SERIES_BY_SERVER = {"vllm": SERIES, "sglang": SGLANG_SERIES}
# vLLM's prompt tokens by where they came from (its PromptTokenStats, the same count the in-process
# engine sums): the GPU prefix cache, and a KV connector such as the CPU tier.
BY_SOURCE = {"vllm": ("vllm:prompt_tokens_by_source_total",
                      {"cached_gpu": "local_cache_hit", "cached_cpu": "external_kv_transfer"})}

_LINE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{.*\})?\s+(\S+)")
_BLOCK = re.compile(r'[{,]block_size="(\d+)"')
_SOURCE = re.compile(r'[{,]source="([^"]*)"')


def parse(text: str) -> dict[str, float]:
    """Prometheus text -> {series name: value summed over its label sets}; comments skipped."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m is None:
            continue
        try:
            v = float(m.group(3))
        except ValueError:
            continue
        out[m.group(1)] = out.get(m.group(1), 0.0) + v
    return out


def counters(text: str, server: str = "vllm") -> dict[str, float]:
    """The series of ``server``'s profile that it exports, by short name (absent ones left out)."""
    values = parse(text)
    out = {}
    for short, names in SERIES_BY_SERVER[server].items():
        for name in names:
            if name in values:
                out[short] = values[name]
                break
    if server in BY_SOURCE:
        series, shorts = BY_SOURCE[server]
        sources = _by_source(text, series)
        out.update({short: sources[src] for short, src in shorts.items() if src in sources})
    return out


def _by_source(text: str, series: str) -> dict[str, float]:
    """One series' values by its ``source`` label, summed over its other labels."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m is None or m.group(1) != series or not m.group(2):
            continue
        src = _SOURCE.search(m.group(2))
        try:
            v = float(m.group(3))
        except ValueError:
            continue
        if src:
            out[src.group(1)] = out.get(src.group(1), 0.0) + v
    return out


def num_blocks(text: str) -> int:
    """The server's KV-cache blocks, from ``vllm:cache_config_info``'s ``num_gpu_blocks`` (0: not
    exported, which the capacity-aware hit-rate estimate reads as unbounded)."""
    for line in text.splitlines():
        if line.startswith("vllm:cache_config_info"):
            m = re.search(r'num_gpu_blocks="(\d+)"', line)
            if m:
                return int(m.group(1))
    return 0


def block_size(text: str) -> int | None:
    """vLLM's prefix-cache block size, from the ``vllm:cache_config_info`` labels (None: not exported)."""
    for line in text.splitlines():
        if line.startswith("vllm:cache_config_info"):
            m = _BLOCK.search(line)
            if m:
                return int(m.group(1))
    return None


def point_deltas(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Two ``counters`` scrapes -> the schema.SERVER_COLUMNS values for what happened between them."""
    nan = math.nan

    def d(k: str) -> float:
        return after[k] - before[k] if k in after and k in before else nan

    def mean_ms(k: str) -> float:
        n = d(f"{k}_count")
        return d(f"{k}_sum") / n * 1e3 if n > 0 else nan

    q, h = d("queries"), d("hits")
    return {
        "server_prefix_queries": q,
        "server_prefix_hits": h,
        "server_hit_rate": h / q if q > 0 else nan,
        "server_requests": d("queue_count"),
        "server_mean_queue_ms": mean_ms("queue"),
        "server_mean_prefill_ms": mean_ms("prefill"),
        "server_mean_decode_ms": mean_ms("decode"),
        "cached_tokens_gpu": d("cached_gpu"),
        "cached_tokens_cpu": d("cached_cpu"),
    }
