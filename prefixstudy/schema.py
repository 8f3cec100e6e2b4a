"""The contracts between stages: the columns of every results file, and the typed records
that carry them.

runner writes these, results stores them, metrics/report/model read them.
Times are milliseconds (``_ms``) or seconds (``_s``); ``*_s`` stamps are seconds
since the start of the point, on the driver's monotonic clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

MODES = ("on", "off")  # prefix caching enabled / disabled

# One row per request (warm-up requests included, flagged by ``warmup``).
REQUEST_COLUMNS: dict[str, str] = {
    "mode": "str",  # "on" | "off"
    "rate": "float64",  # offered request rate of the point, req/s
    "repeat": "int64",  # which repeat of the rate (0-based); each has its own arrival draw
    "request_index": "int64",  # position in the point's schedule; pairs ON with OFF
    "request_id": "str",
    "group": "int64",  # prefix group of the dataset row
    "warmup": "bool",
    "prompt_tokens": "int64",
    "output_tokens": "int64",  # tokens actually generated
    "num_cached_tokens": "int64",  # prompt tokens served from the prefix cache
    "expected_cached_tokens": "int64",  # what ON should serve from an infinite cache (cachesim: upper bound)
    "scheduled_s": "float64",  # when the arrival process said to send it
    "sent_s": "float64",  # when generate() was actually called
    "dispatch_lag_ms": "float64",  # (sent_s - scheduled_s) * 1000
    "ttft_ms": "float64",  # client side: sent -> first token
    "tpot_ms": "float64",  # (e2e - ttft) / (output_tokens - 1)
    "e2e_ms": "float64",  # client side: sent -> last token
    "itl_mean_ms": "float64",
    "itl_p50_ms": "float64",
    "itl_p99_ms": "float64",
    "itl_max_ms": "float64",
    "queue_ms": "float64",  # engine: scheduled_ts - queued_ts
    "prefill_ms": "float64",  # engine: first_token_ts - scheduled_ts
    "decode_ms": "float64",  # engine: last_token_ts - first_token_ts
    "error": "str",  # "" when ok; "unfinished: ..." when cancelled at the point's end
    # Many-prefix, multi-turn and trace workloads; a file without them reads as none (_COLUMN_DEFAULTS):
    "session": "int64",  # session of a multi-turn workload; -1: none
    "turn": "int64",  # turn within the session, 0 first
    "parent_index": "int64",  # request_index of the previous turn, sent first; -1: none
    "estimated_cached_tokens": "int64",  # what ON should serve with the engine's KV-cache blocks (LRU, cachesim)
    # Replicas behind a router; 0 for one engine per mode and for a file without the column:
    "replica": "int64",  # which replica of the mode's fleet answered
}

# One row per engine step, per point.  ``timing`` says where the step was timed:
#   "engine":   inside the engine core (engines.vllm_steps): step_ms is the step's own busy time;
#   "engine-async": the same stamps with vLLM's async scheduling on: a record holds the next
#               step's scheduling and launch, so step_ms is not that step's cost (not fitted);
#   "frontend": runs before that: step_ms is the gap between two StatLogger records seen by the
#               frontend, so the first step after an idle spell carries the whole idle gap;
#   "request":  a backend without steps (echo): one row per request, its whole span.
ITERATION_COLUMNS: dict[str, str] = {
    "mode": "str",
    "rate": "float64",
    "repeat": "int64",
    "timing": "str",
    "step_start_s": "float64",  # since the point's start (measured part only)
    "t_s": "float64",  # step end, since the point's start
    "step_ms": "float64",  # (t_s - step_start_s) * 1000; never contains idle time when timing is "engine"
    "prefill_tokens": "int64",  # prompt tokens computed this step
    "cached_tokens": "int64",  # prompt tokens served from the prefix cache to requests first scheduled here
    "decode_tokens": "int64",  # tokens computed for requests past their prompt
    "context_tokens": "int64",  # KV tokens the scheduled requests attend to after the step
    "num_prefill_reqs": "int64",
    "num_decode_reqs": "int64",
    "num_running": "int64",
    "num_waiting": "int64",
    "kv_cache_usage": "float64",  # 0..1
    "prefix_queries": "int64",  # prompt tokens looked up in the prefix cache this step
    "prefix_hits": "int64",  # of those, found in it
    "prompt_tokens": "int64",  # = prefill_tokens (the name older runs used)
    "generation_tokens": "int64",  # tokens sampled this step
    "replica": "int64",  # which replica of the mode's fleet took the step; 0 for one engine
}

LATENCY_METRICS = ("ttft", "tpot", "e2e", "queue", "prefill", "decode")
PERCENTILES = (50, 90, 99)


# The server's own view of a point, from Prometheus /metrics deltas over its measured requests
# (engines.server_metrics); HTTP backends only.
SERVER_COLUMNS = (
    "server_prefix_queries",  # prompt tokens looked up in the server's prefix cache (vllm:prefix_cache_queries)
    "server_prefix_hits",  # of those, found in it (vllm:prefix_cache_hits)
    "server_hit_rate",  # hits / queries
    "server_requests",  # requests the server finished (count of vllm:request_queue_time_seconds)
    "server_mean_queue_ms",  # vllm:request_queue_time_seconds, sum / count
    "server_mean_prefill_ms",  # vllm:request_prefill_time_seconds, sum / count
    "server_mean_decode_ms",  # vllm:request_decode_time_seconds, sum / count
)


# The measured requests' cached prompt tokens by where the engine found them, as the engine counts
# them (never the cache model): its GPU prefix cache and its CPU tier (a KV connector's external
# hits).  NaN where the engine does not say (cpu: no tier, or a backend that does not split).
TIER_COLUMNS = (
    "cached_tokens_gpu",  # tokens, vLLM: PromptTokenStats.local_cache_hit summed over the point
    "cached_tokens_cpu",  # tokens, vLLM: PromptTokenStats.external_kv_transfer summed over the point
)


def summary_columns() -> list[str]:
    cols = [
        "mode", "rate", "repeat", "status", "n_sent", "n_ok", "n_failed", "n_unfinished",
        "duration_s", "achieved_rate", "output_tok_s",
    ]
    for m in LATENCY_METRICS:
        cols.append(f"mean_{m}_ms")
        cols += [f"p{p}_{m}_ms" for p in PERCENTILES]
    cols += [
        "prefill_share", "hit_rate_measured", "hit_rate_expected", "hit_rate_ok",
        "dispatch_lag_p50_ms", "dispatch_lag_p99_ms", "saturated", "error",
        "saturation_reason",  # why a point is saturated ("" when it is not); added after the first studies
        # Saturation as measured in the point's arrival window (metrics.saturation):
        "arrival_rate",  # the rate the schedule actually offered, req/s
        "completion_ratio", "in_system_first", "in_system_last", "e2e_first_ms", "e2e_last_ms",
        # From the engine's steps and the study's step-cost fit (metrics.engine_fit):
        "step_timing", "busy_steps", "engine_prefill_share", "engine_prefill_share_lo", "engine_prefill_share_hi",
        "decode_slowdown", "decode_slowdown_lo", "decode_slowdown_hi",
        "hit_rate_estimated",  # ON: with the engine's KV-cache blocks (LRU estimate); NaN for older results
    ]
    cols += list(SERVER_COLUMNS)  # added with the HTTP backends; NaN for in-process engines
    cols += list(TIER_COLUMNS)  # added with the CPU tier; NaN where the engine does not say
    return cols


# One row per mode x rate.  ``status`` is "ok" | "failed" | "interrupted".
SUMMARY_COLUMNS = summary_columns()


# ----------------------------------------------------------------- typed frames and records

_DEFAULTS = {"str": "", "bool": False, "int64": 0, "float64": float("nan")}
# Columns added later whose "absent" is not their dtype's default: -1 is none / unknown.
_COLUMN_DEFAULTS = {"session": -1, "parent_index": -1, "estimated_cached_tokens": -1}


def _typed(df: pd.DataFrame, columns: dict[str, str]) -> pd.DataFrame:
    """Columns in schema order and dtype; a missing column gets its default; empty frames keep every column."""
    out = pd.DataFrame(index=df.index)
    for c, t in columns.items():
        col = df[c] if c in df else pd.Series(_COLUMN_DEFAULTS.get(c, _DEFAULTS[t]), index=df.index)
        out[c] = col.fillna("").astype(str) if t == "str" else col.astype(t)
    return out.reset_index(drop=True)


def typed_requests(df: pd.DataFrame | None = None) -> pd.DataFrame:
    return _typed(pd.DataFrame() if df is None else df, REQUEST_COLUMNS)


def typed_iterations(df: pd.DataFrame | None = None) -> pd.DataFrame:
    return _typed(_legacy_iterations(pd.DataFrame() if df is None else df), ITERATION_COLUMNS)


def _legacy_iterations(df: pd.DataFrame) -> pd.DataFrame:
    """Iterations of runs before engine step timing (StatLogger records): fill the new columns from
    the old ones, and say how they were timed."""
    if len(df.columns) == 0 or "prefill_tokens" in df:
        return df
    df = df.copy()
    df["timing"] = df["timing"] if "timing" in df else "frontend"
    df["prefill_tokens"] = df.get("prompt_tokens", 0)
    df["decode_tokens"] = df.get("generation_tokens", 0)
    if "t_s" in df and "step_ms" in df:
        df["step_start_s"] = df["t_s"] - df["step_ms"] / 1e3
    return df


@dataclass
class RequestRecord:
    """One row of requests.parquet (REQUEST_COLUMNS)."""

    mode: str
    rate: float
    repeat: int
    request_index: int
    request_id: str
    group: int
    warmup: bool
    prompt_tokens: int
    output_tokens: int
    num_cached_tokens: int
    expected_cached_tokens: int
    scheduled_s: float
    sent_s: float
    dispatch_lag_ms: float
    ttft_ms: float
    tpot_ms: float
    e2e_ms: float
    itl_mean_ms: float
    itl_p50_ms: float
    itl_p99_ms: float
    itl_max_ms: float
    queue_ms: float
    prefill_ms: float
    decode_ms: float
    error: str
    session: int = -1
    turn: int = 0
    parent_index: int = -1
    estimated_cached_tokens: int = 0
    replica: int = 0


@dataclass
class PointResult:
    """One mode x rate as the runner hands it on: typed request and iteration rows, and the point's
    metadata (status ok | failed, error, n_sent, started_at, duration_s, warmup_s, block_size, ...).
    A failed point is a PointResult too, with whatever rows it has."""

    mode: str
    rate: float
    requests: pd.DataFrame
    iterations: pd.DataFrame
    meta: dict = field(default_factory=dict)
    repeat: int = 0

    @property
    def key(self) -> tuple[str, float, int]:
        return (self.mode, float(self.rate), int(self.repeat))

    @classmethod
    def failed(cls, mode: str, rate: float, error: str, repeat: int = 0, **meta) -> "PointResult":
        return cls(mode, rate, typed_requests(), typed_iterations(), {"status": "failed", "error": error, **meta},
                   repeat)


def point_key(p: dict) -> tuple[str, float, int]:
    """A point's identity, from a manifest entry or a summary row (runs before repeats: repeat 0)."""
    rep = p.get("repeat", 0)
    return (p["mode"], float(p["rate"]), 0 if rep is None or rep != rep else int(rep))  # noqa: PLR0124 - NaN test
