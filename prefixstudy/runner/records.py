"""What a point hands on: one request's record from its trace, the engine's steps as iteration
rows, and the pooled inter-token gaps of the point (``itl_summary``)."""

from __future__ import annotations

import math
from dataclasses import asdict

import numpy as np
import pandas as pd

from prefixstudy.engines import IterationSample, RequestTrace
from prefixstudy.schema import RequestRecord, typed_iterations
from prefixstudy.workloads.base import DatasetRow


def percentile(ordered: list[float], q: float) -> float:
    """``np.percentile(a, q)`` (its default, linear method) of an ascending list, to the bit: the same
    index, weight and interpolation.  A tenth of numpy's time on a request's ~150 gaps, where numpy's
    per-call overhead was most of a simulated point's record keeping."""
    n = len(ordered)
    index = (q / 100) * (n - 1)
    lo = math.floor(index)
    a, b = ordered[lo], ordered[min(lo + 1, n - 1)]
    weight, diff = index - lo, b - a
    return b - diff * (1 - weight) if weight >= 0.5 else a + diff * weight


def make_record(mode: str, rate: float, index: int, request_id: str, row: DatasetRow, warmup: bool,
                scheduled_s: float, t0: float, tr: RequestTrace, expected: int = 0, estimated: int = 0,
                parent_index: int = -1, repeat: int = 0) -> RequestRecord:
    """Client times are on time.monotonic(); engine stamps are the engine's own monotonic stamps."""
    nan = float("nan")
    times = np.asarray(tr.token_times)
    n = len(times)
    ttft = (times[0] - tr.sent_mono) * 1e3 if n else nan
    e2e = (times[-1] - tr.sent_mono) * 1e3 if n else nan
    # Gaps between tokens are measured only where every token arrived on its own clock reading.
    itl = np.diff(times) * 1e3 if n > 1 and not tr.unstreamed_tokens else np.array([])
    ordered = sorted(itl.tolist())
    itl_p50, itl_p99 = (percentile(ordered, 50), percentile(ordered, 99)) if ordered else (nan, nan)
    error = tr.error
    if not error and n < row.output_len:
        error = f"short output: {n} of {row.output_len} tokens"
    elif not error and n > row.output_len:  # not the work asked for: a server that ignores max_tokens
        error = f"long output: {n} tokens, {row.output_len} asked"

    def span(a: float, b: float) -> float:
        return (b - a) * 1e3 if a > 0 and b > 0 else nan

    return RequestRecord(
        mode=mode, rate=rate, repeat=repeat, request_index=index, request_id=request_id, group=row.group, warmup=warmup,
        prompt_tokens=len(row.prompt_token_ids), output_tokens=n, num_cached_tokens=tr.num_cached_tokens,
        expected_cached_tokens=expected,
        scheduled_s=scheduled_s, sent_s=tr.sent_mono - t0,
        dispatch_lag_ms=(tr.sent_mono - t0 - scheduled_s) * 1e3,
        ttft_ms=ttft, e2e_ms=e2e, tpot_ms=(e2e - ttft) / (n - 1) if n > 1 else nan,
        itl_mean_ms=float(itl.mean()) if len(itl) else nan,
        itl_p50_ms=itl_p50, itl_p99_ms=itl_p99,
        itl_max_ms=float(itl.max()) if len(itl) else nan,
        queue_ms=span(tr.queued_ts, tr.scheduled_ts),
        prefill_ms=span(tr.scheduled_ts, tr.first_token_ts),
        decode_ms=span(tr.first_token_ts, tr.last_token_ts),
        error=error, session=row.session, turn=row.turn, parent_index=parent_index,
        estimated_cached_tokens=estimated, replica=tr.replica,
    )


def iteration_frame(mode: str, rate: float, samples: list[IterationSample], t0: float, repeat: int = 0,
                    timing: str = "engine") -> pd.DataFrame:
    """Engine steps as iteration rows, times in seconds since the point's start ``t0``."""
    df = pd.DataFrame([asdict(s) for s in samples])
    if df.empty:
        return typed_iterations(df)
    df["step_start_s"] = df.pop("start_mono") - t0
    df["t_s"] = df.pop("end_mono") - t0
    df["host_step_ms"] = (df["t_s"] - df["step_start_s"]) * 1e3
    # A step timed on the GPU costs its span there; the host stamps stay beside it.
    gpu = df.pop("gpu_ms").to_numpy(dtype=float)
    timed = np.isfinite(gpu)
    df["step_ms"] = np.where(timed, gpu, df["host_step_ms"])
    df = df.rename(columns={"queried_tokens": "prefix_queries", "sampled_tokens": "generation_tokens"})
    df["prefix_hits"] = df["cached_tokens"]
    df["prompt_tokens"] = df["prefill_tokens"]
    df["mode"], df["rate"], df["repeat"] = mode, rate, repeat
    df["timing"] = np.where(timed, "gpu-span", timing)
    return typed_iterations(df)


def itl_summary(gaps: list[np.ndarray], percentiles) -> dict[str, float | None]:
    """Every inter-token gap (ms) of a point's counted requests, pooled as `vllm bench serve` pools
    them: median, std and percentiles (keys ``median``, ``std``, ``p<q>``).  requests.parquet keeps
    per-request summaries only, so the point's metadata carries these for the bench export."""
    v = np.concatenate(gaps) if gaps else np.zeros(0)
    if not v.size:
        return {}
    out = {"median": float(np.median(v)), "std": float(v.std())}
    out.update({f"p{int(q) if int(q) == q else q}": float(np.percentile(v, q)) for q in percentiles})
    return out
