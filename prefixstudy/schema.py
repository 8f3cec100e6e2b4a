"""The contracts between stages: the columns of every results file, and the typed records
that carry them.

runner writes these, results stores them, metrics/report/model read them.
Times are milliseconds (``_ms``) or seconds (``_s``); ``*_s`` stamps are seconds
since the start of the point, on the driver's monotonic clock.

Each table is ``{column: (dtype, meaning)}``: the dtype is what the file holds, the meaning is
what the docs' results reference prints (docs/hooks/reference.py), so the two cannot drift.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

MODES = ("on", "off")  # prefix caching enabled / disabled
KEY = ["mode", "rate", "repeat"]  # the columns that name one point

# One row per request (warm-up requests included, flagged by ``warmup``).
REQUEST_FIELDS: dict[str, tuple[str, str]] = {
    "mode": ("str", "the arm: `on`, `off` or an arm's name"),
    "rate": ("float64", "offered request rate of the point, req/s (`inf`: all at once)"),
    "repeat": ("int64", "which repeat of the rate (0-based); each has its own arrival draw"),
    "request_index": ("int64", "position in the point's schedule; pairs a request across arms"),
    "request_id": ("str", "the id the engine saw"),
    "group": ("int64", "prefix group of the dataset row"),
    "warmup": ("bool", "a warm-up request, sent before the measured ones and left out of every statistic"),
    "prompt_tokens": ("int64", "tokens in the prompt as sent (a later turn: its whole history)"),
    "output_tokens": ("int64", "tokens actually generated"),
    "num_cached_tokens": ("int64", "prompt tokens the engine served from its prefix cache, as it reported them"),
    "expected_cached_tokens": ("int64", "tokens ON should serve from an infinite cache (cachesim: the upper bound)"),
    "scheduled_s": ("float64", "s since the point's start: when the arrival process said to send it"),
    "sent_s": ("float64", "s since the point's start: when it was actually sent"),
    "dispatch_lag_ms": ("float64", "ms, (sent_s - scheduled_s) x 1000"),
    "ttft_ms": ("float64", "ms, client clock: sent -> first token"),
    "tpot_ms": ("float64", "ms, (e2e_ms - ttft_ms) / (output_tokens - 1); NaN for one token"),
    "e2e_ms": ("float64", "ms, client clock: sent -> last token"),
    "itl_mean_ms": ("float64", "ms, mean gap between consecutive tokens; NaN where the tokens did not stream one by one"),
    "itl_p50_ms": ("float64", "ms, median gap between consecutive tokens"),
    "itl_p99_ms": ("float64", "ms, 99th percentile of the gaps between consecutive tokens"),
    "itl_max_ms": ("float64", "ms, longest gap between consecutive tokens"),
    "queue_ms": ("float64", "ms, engine clock: scheduled_ts - queued_ts; NaN where the engine has no stamps (HTTP)"),
    "prefill_ms": ("float64", "ms, engine clock: first_token_ts - scheduled_ts; NaN without stamps"),
    "decode_ms": ("float64", "ms, engine clock: last_token_ts - first_token_ts; NaN without stamps"),
    "error": ("str", "empty when ok; `unfinished: ...` when not sent in time or cancelled by the point's or "
              "the request's deadline; otherwise the failure"),
    # Many-prefix, multi-turn and trace workloads; a file without them reads as none (_COLUMN_DEFAULTS):
    "session": ("int64", "session of a multi-turn workload; -1: none"),
    "turn": ("int64", "turn within the session, 0 first"),
    "parent_index": ("int64", "request_index of the previous turn, sent first; -1: none"),
    "estimated_cached_tokens": ("int64", "tokens ON should serve with the engine's own KV-cache blocks (LRU "
                                "estimate, cachesim); -1: recorded before the estimate"),
    # Replicas behind a router; 0 for one engine per mode and for a file without the column:
    "replica": ("int64", "which replica of the arm's fleet answered; 0 for one engine"),
}
REQUEST_COLUMNS: dict[str, str] = {c: t for c, (t, _) in REQUEST_FIELDS.items()}

# One row per engine step, per point.  ``timing`` says where the step was timed:
#   "engine":   inside the engine core (engines.vllm_steps): step_ms is the step's own busy time;
#   "gpu-span": the step's span on the GPU (engines.vllm_gpu_timer), async scheduling or not:
#               step_ms is that span, host_step_ms the scheduler's stamps;
#   "engine-async": the scheduler's stamps with vLLM's async scheduling on and no GPU timer: a
#               record holds the next step's scheduling and launch, so step_ms is not that
#               step's cost (not fitted);
#   "frontend": runs before that: step_ms is the gap between two StatLogger records seen by the
#               frontend, so the first step after an idle spell carries the whole idle gap;
#   "request":  a backend without steps (echo): one row per request, its whole span.
ITERATION_FIELDS: dict[str, tuple[str, str]] = {
    "mode": ("str", "the arm"),
    "rate": ("float64", "offered request rate of the point, req/s"),
    "repeat": ("int64", "which repeat of the rate (0-based)"),
    "timing": ("str", "where the step was timed: `gpu-span`, `engine`, `engine-async`, `frontend` or `request` "
               "(above)"),
    "step_start_s": ("float64", "s since the point's start: step start (measured part only)"),
    "t_s": ("float64", "s since the point's start: step end"),
    "step_ms": ("float64", "ms, the step's cost: its GPU span when timing is `gpu-span`, else (t_s - step_start_s) "
                "x 1000; never holds idle time when timing is `engine` or `gpu-span`"),
    "prefill_tokens": ("int64", "prompt tokens computed this step"),
    "cached_tokens": ("int64", "prompt tokens served from the prefix cache to requests first scheduled here"),
    "decode_tokens": ("int64", "tokens computed for requests past their prompt"),
    "context_tokens": ("int64", "KV tokens the scheduled requests attend to after the step"),
    "num_prefill_reqs": ("int64", "requests that computed prompt tokens this step"),
    "num_decode_reqs": ("int64", "requests that decoded this step"),
    "num_running": ("int64", "requests in the scheduler's running queue"),
    "num_waiting": ("int64", "requests in the scheduler's waiting queue"),
    "kv_cache_usage": ("float64", "share of KV-cache blocks in use, 0..1"),
    "prefix_queries": ("int64", "prompt tokens looked up in the prefix cache this step"),
    "prefix_hits": ("int64", "of those, found in it"),
    "prompt_tokens": ("int64", "= prefill_tokens (the name older runs used)"),
    "generation_tokens": ("int64", "tokens sampled this step"),
    "replica": ("int64", "which replica of the arm's fleet took the step; 0 for one engine"),
    "host_step_ms": ("float64", "ms, (t_s - step_start_s) x 1000: the host stamps' span, whatever timed step_ms"),
}
ITERATION_COLUMNS: dict[str, str] = {c: t for c, (t, _) in ITERATION_FIELDS.items()}

LATENCY_METRICS = ("ttft", "tpot", "e2e", "queue", "prefill", "decode")
PERCENTILES = (50, 90, 99)


# The server's own view of a point, from Prometheus /metrics deltas over its measured requests
# (engines.server_metrics); HTTP backends only.
SERVER_FIELDS: dict[str, tuple[str, str]] = {
    "server_prefix_queries": ("float64", "prompt tokens looked up in the server's prefix cache "
                              "(vllm:prefix_cache_queries; sglang:prompt_tokens_total)"),
    "server_prefix_hits": ("float64", "of those, found in it (vllm:prefix_cache_hits; sglang:cached_tokens_total)"),
    "server_hit_rate": ("float64", "server_prefix_hits / server_prefix_queries"),
    "server_requests": ("float64", "requests the server finished (count of vllm:request_queue_time_seconds)"),
    "server_mean_queue_ms": ("float64", "ms, vllm:request_queue_time_seconds, sum / count"),
    "server_mean_prefill_ms": ("float64", "ms, vllm:request_prefill_time_seconds, sum / count"),
    "server_mean_decode_ms": ("float64", "ms, vllm:request_decode_time_seconds, sum / count"),
}
SERVER_COLUMNS = tuple(SERVER_FIELDS)


# The measured requests' cached prompt tokens by where the engine found them, as the engine counts
# them (never the cache model): its GPU prefix cache and its CPU tier (a KV connector's external
# hits).  NaN where the engine does not say (cpu: no tier, or a backend that does not split).
TIER_FIELDS: dict[str, tuple[str, str]] = {
    "cached_tokens_gpu": ("float64", "tokens, vLLM: PromptTokenStats.local_cache_hit summed over the point"),
    "cached_tokens_cpu": ("float64", "tokens, vLLM: PromptTokenStats.external_kv_transfer summed over the point"),
}
TIER_COLUMNS = tuple(TIER_FIELDS)

# Where the point's engine ran (shared.machine.engine_machine), asked by the process that drives it:
# in process, this host; under Ray, the engine actor's node.  Repeats of one rate on different
# machines are told apart by these (metrics.machines); "" where not known.
MACHINE_FIELDS: dict[str, tuple[str, str]] = {
    "host": ("str", "host name of the engine's machine; `http` (a server given by its address): the client's"),
    "boot_id": ("str", "that machine's kernel boot id, new at every boot, so two leases of one host name differ; "
                "empty where not known"),
    "gpu_name": ("str", "the GPU the engine computed on (NVML's name); empty on the CPU or where not known"),
    "gpu_uuid": ("str", "that GPU's UUID; empty on the CPU or where not known (a Ray actor whose vLLM workers "
                 "hold the GPUs)"),
}
MACHINE_COLUMNS = tuple(MACHINE_FIELDS)

_LATENCY_WHAT = {"ttft": "TTFT", "tpot": "TPOT", "e2e": "E2E", "queue": "engine queue time",
                 "prefill": "engine prefill time", "decode": "engine decode time"}


def summary_fields() -> dict[str, tuple[str, str]]:
    """summary.csv's columns in order, each with its dtype and meaning."""
    cols = {
        "mode": ("str", "the arm"),
        "rate": ("float64", "offered request rate, req/s"),
        "repeat": ("int64", "which repeat of the rate (0-based)"),
        "status": ("str", "`ok`, `failed` or `interrupted`"),
        "n_sent": ("int64", "measured requests the point planned (n_ok + n_failed + n_unfinished)"),
        "n_ok": ("int64", "counted requests: measured and finished without error"),
        "n_failed": ("int64", "measured requests with an error other than unfinished"),
        "n_unfinished": ("int64", "measured requests not sent in time or cancelled by a deadline (`unfinished: ...`)"),
        "duration_s": ("float64", "s, first counted send to last counted completion"),
        "achieved_rate": ("float64", "req/s, n_ok / duration_s"),
        "output_tok_s": ("float64", "tokens/s, output tokens of the counted requests / duration_s"),
    }
    for m in LATENCY_METRICS:
        what = _LATENCY_WHAT[m]
        cols[f"mean_{m}_ms"] = ("float64", f"ms, mean {what} of the counted requests")
        cols.update({f"p{p}_{m}_ms": ("float64", f"ms, {p}th percentile of {what}") for p in PERCENTILES})
    cols.update({
        "prefill_share": ("float64", "mean_prefill_ms / mean_e2e_ms"),
        "hit_rate_measured": ("float64", "num_cached_tokens / prompt_tokens over the counted requests"),
        "hit_rate_expected": ("float64", "expected_cached_tokens / prompt_tokens (the infinite-cache bound)"),
        "hit_rate_ok": ("bool", "the hit-rate check: ON within `checks.hit_rate_tolerance` of what the cache can "
                        "hold, OFF at 0"),
        "dispatch_lag_p50_ms": ("float64", "ms, median dispatch lag of the counted requests"),
        "dispatch_lag_p99_ms": ("float64", "ms, 99th percentile of the dispatch lag"),
        "saturated": ("bool", "the engine did not keep up in the arrival window (metrics.saturation); its "
                      "latency is a lower bound"),
        "error": ("str", "why the point failed; empty when it did not"),
        # Added after the first studies:
        "saturation_reason": ("str", "why the point is saturated, in words; empty when it is not"),
        # Saturation as measured in the point's arrival window (metrics.saturation):
        "arrival_rate": ("float64", "req/s, the rate the schedule actually offered: (n - 1) / (last - first "
                         "scheduled send)"),
        "completion_ratio": ("float64", "share of the window's arrivals that completed within it (extended by "
                             "the early latency)"),
        "in_system_first": ("float64", "requests in the engine (running + waiting; HTTP: in flight), mean over "
                            "the window's first third"),
        "in_system_last": ("float64", "the same over its last third"),
        "e2e_first_ms": ("float64", "ms, mean E2E of the first third of requests by schedule"),
        "e2e_last_ms": ("float64", "ms, mean E2E of the last third"),
        # From the engine's steps and the study's step-cost fit (costmodel.engine_fit):
        "step_timing": ("str", "the `timing` of the point's iteration rows"),
        "busy_steps": ("int64", "engine steps that measure work, the fit's rows"),
        "engine_prefill_share": ("float64", "share of busy engine time spent on prompts (step-cost fit)"),
        "engine_prefill_share_lo": ("float64", "its 95 % interval, lower end (block bootstrap of the steps)"),
        "engine_prefill_share_hi": ("float64", "its 95 % interval, upper end"),
        "decode_slowdown": ("float64", "how much longer per decode token the steps were than without their "
                            "prefill work (x)"),
        "decode_slowdown_lo": ("float64", "its 95 % interval, lower end"),
        "decode_slowdown_hi": ("float64", "its 95 % interval, upper end"),
        "hit_rate_estimated": ("float64", "estimated_cached_tokens / prompt_tokens: what the engine's own "
                               "blocks hold (LRU estimate); NaN for older results"),
    })
    cols.update(SERVER_FIELDS)  # added with the HTTP backends; NaN for in-process engines
    cols.update(TIER_FIELDS)  # added with the CPU tier; NaN where the engine does not say
    cols.update({  # added with the backlog-trend saturation rule (metrics.saturation.backlog_trend)
        "backlog_growth_per_s": ("float64", "req/s, least-squares slope of the requests in the system over the "
                                 "window after its burn-in (metrics.saturation.backlog_trend)"),
        "backlog_growth_lo": ("float64", "req/s, its one-sided 99 % lower bound (t on batch means); decides only "
                              "where neither the admission limit nor engine steps are known"),
        "full_share": ("float64", "share of the window's last half with the requests in the system at >= 80 % of "
                       "the engine's admission limit (max_num_seqs x replicas); NaN: limit not known"),
        "waiting_share": ("float64", "share of the engine's steps in the window's last half with requests waiting; "
                          "NaN: no engine steps"),
    })
    cols.update(MACHINE_FIELDS)  # added with per-point machines; filled from the manifest for older runs
    return cols


def summary_columns() -> list[str]:
    return list(SUMMARY_FIELDS)


# One row per mode x rate x repeat.
SUMMARY_FIELDS = summary_fields()
SUMMARY_COLUMNS = summary_columns()


# ----------------------------------------------------------------- typed frames and records

_DEFAULTS = {"str": "", "bool": False, "int64": 0, "float64": float("nan")}
# Columns added later whose "absent" is not their dtype's default: -1 is none / unknown.
_COLUMN_DEFAULTS = {"session": -1, "parent_index": -1, "estimated_cached_tokens": -1}


def _typed(df: pd.DataFrame, columns: dict[str, str]) -> pd.DataFrame:
    """Columns in schema order and dtype; a missing column gets its default; empty frames keep every column.

    The frame is built once from its columns' arrays: inserting them one at a time grows the
    columns' string index at each step, most of the cost for a point's records."""
    n = len(df)
    data = {}
    for c, t in columns.items():
        if c not in df:
            default = _COLUMN_DEFAULTS.get(c, _DEFAULTS[t])
            data[c] = pd.array([default] * n, dtype=str) if t == "str" else np.full(n, default, dtype=t)
            continue
        col = df[c]
        if t == "str":
            col = col.fillna("").astype(str)
        elif col.dtype != t:
            col = col.astype(t)
        data[c] = col.array if isinstance(col.dtype, pd.api.extensions.ExtensionDtype) else col.to_numpy()
    return pd.DataFrame(data, index=pd.RangeIndex(n))  # a dict of arrays is copied: no view of ``df``


def typed_frame(df: pd.DataFrame, fields: dict[str, tuple[str, str]]) -> pd.DataFrame:
    """``df`` as the table ``fields`` (``{column: (dtype, meaning)}``) says: exactly its columns, in
    its order and dtypes; a column ``df`` lacks gets its dtype's default, one it has beyond them is
    dropped.  The writers of the sweep tables (capacity.csv, routing.csv, ...) go through it, so a
    file holds the columns the docs list."""
    return _typed(df, {c: t for c, (t, _) in fields.items()})


def typed_requests(df: pd.DataFrame | None = None) -> pd.DataFrame:
    return _typed(pd.DataFrame() if df is None else df, REQUEST_COLUMNS)


def typed_iterations(df: pd.DataFrame | None = None) -> pd.DataFrame:
    return _typed(pd.DataFrame() if df is None else df, ITERATION_COLUMNS)


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
