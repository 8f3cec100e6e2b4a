"""One summary.csv row per point, and saturation: defined once, here, for summary.csv and the report."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from prefixstudy.costmodel import engine_fit
from prefixstudy.metrics.requests import (KEY, duration_s, hit_rate_estimated, hit_rate_ok, hit_rates, measured,
                                          percentile, split_outcomes, with_repeat)
from prefixstudy.metrics.saturation import saturation
from prefixstudy.schema import (LATENCY_METRICS, MACHINE_COLUMNS, PERCENTILES, SERVER_COLUMNS, SUMMARY_COLUMNS,
                                TIER_COLUMNS)


def _per_s(n: float, seconds: float) -> float:
    return n / seconds if seconds > 0 else math.nan

# ----------------------------------------------------------------- summary rows

def _latencies(ok: pd.DataFrame) -> dict:
    row = {}
    for m in LATENCY_METRICS:
        v = ok[f"{m}_ms"].dropna().to_numpy()
        row[f"mean_{m}_ms"] = float(v.mean()) if len(v) else math.nan
        for p in PERCENTILES:
            row[f"p{p}_{m}_ms"] = float(np.percentile(v, p)) if len(v) else math.nan
    return row


def summarize_point(requests: pd.DataFrame, meta: dict, tolerance: float = 0.05,
                    iterations: pd.DataFrame | None = None) -> dict:
    """One summary row (schema.SUMMARY_COLUMNS, in order) for one mode x rate x repeat; the engine
    columns (costmodel.engine_fit.ENGINE_COLUMNS) are NaN here: they need the whole study's fit.

    ``requests``/``iterations``: this point's rows only.  ``meta``: mode, rate and optionally
    repeat, status, error, n_sent, duration_s (used when no request finished), admission_limit
    (the engine's max_num_seqs x replicas, for the saturation check).
    """
    ok, n_failed, n_unfinished = split_outcomes(requests)
    duration = duration_s(ok) if not ok.empty else float(meta.get("duration_s", math.nan))
    row: dict = {"mode": meta["mode"], "rate": float(meta["rate"]), "repeat": int(meta.get("repeat", 0)),
                 "status": meta.get("status", "ok"),
                 "n_sent": int(meta.get("n_sent", len(measured(requests)))), "n_ok": len(ok),
                 "n_failed": n_failed, "n_unfinished": n_unfinished, "duration_s": duration,
                 "achieved_rate": _per_s(len(ok), duration),
                 "output_tok_s": _per_s(float(ok["output_tokens"].sum()), duration), **_latencies(ok)}
    row["prefill_share"] = (row["mean_prefill_ms"] / row["mean_e2e_ms"]) if row["mean_e2e_ms"] else math.nan
    row["hit_rate_measured"], row["hit_rate_expected"] = hit_rates(requests)
    # Checked against what the engine's cache can hold (the LRU estimate); the infinite-cache bound
    # above it is reported, and a gap between the two is eviction, not a failure.
    # An arm's caching is in its point's record; points recorded before arms are on / off by name.
    cached = bool(meta.get("prefix_caching", meta["mode"] != "off"))
    row["hit_rate_estimated"] = hit_rate_estimated(requests) if cached else row["hit_rate_expected"]
    bound = row["hit_rate_estimated"] if not math.isnan(row["hit_rate_estimated"]) else row["hit_rate_expected"]
    row["hit_rate_ok"] = hit_rate_ok("on" if cached else "off", row["hit_rate_measured"], bound, tolerance)
    lag = ok["dispatch_lag_ms"]
    row["dispatch_lag_p50_ms"], row["dispatch_lag_p99_ms"] = percentile(lag, 50), percentile(lag, 99)
    sat = saturation(requests, iterations, meta.get("admission_limit"))
    row.update({k: sat[k] for k in ("arrival_rate", "completion_ratio", "in_system_first", "in_system_last",
                                    "e2e_first_ms", "e2e_last_ms", "backlog_growth_per_s", "backlog_growth_lo",
                                    "full_share", "waiting_share")})
    row["saturated"], row["saturation_reason"] = sat["saturated"], sat["reason"]
    row["error"] = meta.get("error", "") or ""
    # HTTP backends put the server's in the point's meta, engines that split their hits by tier
    # put those there (None: the engine has no such number).
    for c in (*SERVER_COLUMNS, *TIER_COLUMNS):
        row[c] = math.nan if meta.get(c) is None else float(meta[c])
    for c in MACHINE_COLUMNS:  # where the engine ran, as the runner recorded it; "" where not known
        row[c] = meta.get(c) or ""
    return {c: row.get(c, math.nan) for c in SUMMARY_COLUMNS}


def tier_hit_rates(summary_rows: pd.DataFrame, requests: pd.DataFrame) -> tuple[float, float]:
    """Share of prompt tokens the engine says it served from its GPU prefix cache and from its CPU
    tier (summary's cached_tokens_gpu / cached_tokens_cpu, summed over ``summary_rows``), over the
    prompt tokens of the measured requests in ``requests`` that got a first token (the engine
    counts a request's cached tokens when it first outputs).  NaN where the engine does not say."""
    got = requests[~requests["warmup"].astype(bool) & (requests["output_tokens"] > 0)]
    prompt = float(got["prompt_tokens"].sum())
    out = []
    for c in ("cached_tokens_gpu", "cached_tokens_cpu"):
        v = summary_rows[c].to_numpy(float) if c in summary_rows else np.array([math.nan])
        out.append(float(v.sum() / prompt) if prompt and len(v) and np.isfinite(v).all() else math.nan)
    return out[0], out[1]


def point_rows(df: pd.DataFrame, point: dict) -> pd.DataFrame:
    """The rows of ``df`` of one point (mode, rate, repeat; repeat 0 when the point has none)."""
    return df[(df["mode"] == point["mode"]) & (df["rate"] == point["rate"]) & (df["repeat"] == point.get("repeat", 0))]


def summarize(requests: pd.DataFrame, points: list[dict], tolerance: float = 0.05,
              iterations: pd.DataFrame | None = None) -> pd.DataFrame:
    """summary.csv: ``summarize_point`` of every point in ``points`` (dicts with mode, rate, repeat,
    status, error, n_sent), ON first, then by rate and repeat.  Without ``iterations`` the number of
    requests in the system is not looked at."""
    requests = with_repeat(requests)
    iterations = with_repeat(iterations) if iterations is not None else None
    rows = [summarize_point(point_rows(requests, p), p, tolerance,
                            point_rows(iterations, p) if iterations is not None and len(iterations) else None)
            for p in points]
    df = pd.DataFrame(rows, columns=SUMMARY_COLUMNS)
    return df.sort_values(["mode", "rate", "repeat"], key=lambda s: s.map({"on": 0, "off": 1}) if s.name == "mode" else s,
                          ignore_index=True)


def add_engine_columns(summary: pd.DataFrame, iterations: pd.DataFrame | None,
                       fit: "engine_fit.StepFit | None") -> pd.DataFrame:
    """summary.csv rows with their engine columns (costmodel.engine_fit) filled from ``fit``."""
    out = summary.drop(columns=[c for c in engine_fit.ENGINE_COLUMNS if c in summary])
    if iterations is None or not len(iterations):
        eng = pd.DataFrame(columns=KEY + engine_fit.ENGINE_COLUMNS)
    else:
        eng = engine_fit.engine_columns(iterations, fit)
    out = out.merge(eng, on=KEY, how="left")
    out["busy_steps"] = out["busy_steps"].fillna(0).astype(int)
    out["step_timing"] = out["step_timing"].fillna("")
    return out[SUMMARY_COLUMNS]


# ----------------------------------------------------------------- knee and max rates

def knee_rate(points: pd.DataFrame, mode: str) -> float:
    """Highest offered rate below the mode's first saturated rate (see the package docstring).

    ``points``: mode, rate, saturated.  All unsaturated: the highest rate measured.
    """
    p = points[points["mode"] == mode].sort_values("rate")
    knee = math.nan
    for rate, sat in zip(p["rate"], p["saturated"], strict=True):
        if bool(sat):
            break
        knee = float(rate)
    return knee


def max_rate_meeting(points: pd.DataFrame, metric: str, threshold: float, mode: str,
                     require_unsaturated: bool = True) -> float:
    """Highest offered rate r such that every point of ``mode`` at rates <= r meets
    ``metric <= threshold`` (and is unsaturated, by default).  NaN if the lowest fails."""
    p = points[points["mode"] == mode].sort_values("rate")
    best = math.nan
    for _, r in p.iterrows():
        ok = bool(np.isfinite(r[metric]) and r[metric] <= threshold)
        if require_unsaturated and bool(r.get("saturated", False)):
            ok = False
        if not ok:
            break
        best = float(r["rate"])
    return best


def max_rate_curve(points: pd.DataFrame, metric: str, thresholds: Sequence[float],
                   modes: Sequence[str] = ("on", "off"), require_unsaturated: bool = True) -> pd.DataFrame:
    """``max_rate_meeting`` for every threshold and mode: columns threshold_ms, mode, max_rate."""
    rows = [{"threshold_ms": float(t), "mode": m,
             "max_rate": max_rate_meeting(points, metric, t, m, require_unsaturated)}
            for m in modes for t in thresholds]
    return pd.DataFrame(rows, columns=["threshold_ms", "mode", "max_rate"])
