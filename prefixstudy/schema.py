"""The contracts between stages: the columns of every results file.

runner writes these, results stores them, analysis/report/model read them.
Times are milliseconds (``_ms``) or seconds (``_s``); ``*_s`` stamps are seconds
since the start of the point, on the driver's monotonic clock.
"""

from __future__ import annotations

MODES = ("on", "off")  # prefix caching enabled / disabled

# One row per request (warm-up requests included, flagged by ``warmup``).
REQUEST_COLUMNS: dict[str, str] = {
    "mode": "str",  # "on" | "off"
    "rate": "float64",  # offered request rate of the point, req/s
    "request_index": "int64",  # position in the point's schedule; pairs ON with OFF
    "request_id": "str",
    "group": "int64",  # prefix group of the dataset row
    "warmup": "bool",
    "prompt_tokens": "int64",
    "output_tokens": "int64",  # tokens actually generated
    "num_cached_tokens": "int64",  # prompt tokens served from the prefix cache
    "expected_cached_tokens": "int64",  # what ON should serve from cache (block-aligned shared prefix)
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
}

# One row per engine iteration (a StatLogger.record call), per point.
ITERATION_COLUMNS: dict[str, str] = {
    "mode": "str",
    "rate": "float64",
    "t_s": "float64",  # since the point's start (measured part only)
    "step_ms": "float64",  # time since the previous record in this point (NaN for the first)
    "num_running": "int64",
    "num_waiting": "int64",
    "kv_cache_usage": "float64",  # 0..1
    "prefix_queries": "int64",  # tokens queried against the prefix cache this step
    "prefix_hits": "int64",  # tokens found in it
    "prompt_tokens": "int64",  # prompt tokens computed this step
    "generation_tokens": "int64",  # tokens generated this step
}

LATENCY_METRICS = ("ttft", "tpot", "e2e", "queue", "prefill", "decode")
PERCENTILES = (50, 90, 99)


def summary_columns() -> list[str]:
    cols = [
        "mode", "rate", "status", "n_sent", "n_ok", "n_failed", "n_unfinished",
        "duration_s", "achieved_rate", "output_tok_s",
    ]
    for m in LATENCY_METRICS:
        cols.append(f"mean_{m}_ms")
        cols += [f"p{p}_{m}_ms" for p in PERCENTILES]
    cols += [
        "prefill_share", "hit_rate_measured", "hit_rate_expected", "hit_rate_ok",
        "dispatch_lag_p50_ms", "dispatch_lag_p99_ms", "saturated", "error",
    ]
    return cols


# One row per mode x rate.  ``status`` is "ok" | "failed" | "interrupted".
SUMMARY_COLUMNS = summary_columns()
