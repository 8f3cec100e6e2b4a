"""Stage: analysis.  Pure functions: request and iteration rows in, one summary row per point out."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from prefixstudy.schema import LATENCY_METRICS, PERCENTILES, SUMMARY_COLUMNS

SATURATION_RATIO = 0.95  # achieved below this share of the offered rate means the engine fell behind


def split_outcomes(req: pd.DataFrame) -> tuple[pd.DataFrame, int, int]:
    """Measured rows split into (ok rows, n_failed, n_unfinished)."""
    m = req[~req["warmup"]]
    err = m["error"].fillna("")
    unfinished = err.str.startswith("unfinished")
    ok = m[err == ""]
    return ok, int(((err != "") & ~unfinished).sum()), int(unfinished.sum())


def hit_rates(req: pd.DataFrame) -> tuple[float, float]:
    """(measured, expected) share of prompt tokens served from the prefix cache, over ok requests."""
    ok, _, _ = split_outcomes(req)
    prompt = ok["prompt_tokens"].sum()
    if not prompt:
        return math.nan, math.nan
    return float(ok["num_cached_tokens"].sum() / prompt), float(ok["expected_cached_tokens"].sum() / prompt)


def hit_rate_ok(mode: str, measured: float, expected: float, tolerance: float) -> bool:
    """ON must reach the expected rate (within tolerance); OFF must never hit."""
    if math.isnan(measured):
        return True
    if mode == "off":
        return measured == 0.0
    return measured >= expected - tolerance


def _offered_span_s(ok: pd.DataFrame) -> float:
    """Seconds the schedule spans plus one typical request: what an engine that keeps up needs."""
    if ok.empty:
        return math.nan
    return float(ok["scheduled_s"].max() - ok["scheduled_s"].min() + ok["e2e_ms"].median() / 1e3)


def summarize_point(req: pd.DataFrame, meta: dict, tolerance: float = 0.05) -> dict:
    """One summary row (schema.SUMMARY_COLUMNS) for one mode x rate."""
    ok, n_failed, n_unfinished = split_outcomes(req)
    n_sent = int(meta.get("n_sent", len(req[~req["warmup"]])))
    row: dict = {"mode": meta["mode"], "rate": float(meta["rate"]), "status": meta.get("status", "ok"),
                 "n_sent": n_sent, "n_ok": len(ok), "n_failed": n_failed, "n_unfinished": n_unfinished}
    if not ok.empty:
        duration = float((ok["sent_s"] + ok["e2e_ms"] / 1e3).max() - ok["sent_s"].min())
    else:
        duration = float(meta.get("duration_s", math.nan))
    row["duration_s"] = duration
    row["achieved_rate"] = len(ok) / duration if duration > 0 else math.nan
    row["output_tok_s"] = float(ok["output_tokens"].sum() / duration) if duration > 0 else math.nan
    for m in LATENCY_METRICS:
        v = ok[f"{m}_ms"].dropna().to_numpy()
        row[f"mean_{m}_ms"] = float(v.mean()) if len(v) else math.nan
        for p in PERCENTILES:
            row[f"p{p}_{m}_ms"] = float(np.percentile(v, p)) if len(v) else math.nan
    row["prefill_share"] = (row["mean_prefill_ms"] / row["mean_e2e_ms"]) if row["mean_e2e_ms"] else math.nan
    measured, expected = hit_rates(req)
    row["hit_rate_measured"], row["hit_rate_expected"] = measured, expected
    row["hit_rate_ok"] = hit_rate_ok(meta["mode"], measured, expected, tolerance)
    lag = ok["dispatch_lag_ms"].dropna().to_numpy()
    row["dispatch_lag_p50_ms"] = float(np.percentile(lag, 50)) if len(lag) else math.nan
    row["dispatch_lag_p99_ms"] = float(np.percentile(lag, 99)) if len(lag) else math.nan
    offered = len(ok) / _offered_span_s(ok) if not ok.empty else math.nan
    from prefixstudy.stats import open_at_end

    row["saturated"] = bool(open_at_end(req).any() or (not math.isnan(offered)
                                                      and row["achieved_rate"] < SATURATION_RATIO * offered))
    row["error"] = meta.get("error", "") or ""
    return row


def summarize(requests: pd.DataFrame, points: list[dict], tolerance: float = 0.05,
              iterations: pd.DataFrame | None = None) -> pd.DataFrame:
    """Summary of every point in ``points`` (dicts with mode, rate, status, error, n_sent).

    With ``iterations``, a waiting queue that grows through the arrival window also marks a point
    saturated (stats.queue_growth), so summary.csv and the report share one definition.
    """
    rows = []
    for p in points:
        sel = requests[(requests["mode"] == p["mode"]) & (requests["rate"] == p["rate"])]
        rows.append(summarize_point(sel, p, tolerance))
    df = pd.DataFrame(rows, columns=SUMMARY_COLUMNS)
    if iterations is not None and len(iterations) and len(df):
        from prefixstudy import stats

        q = stats.queue_growth(iterations, stats.arrival_end(requests))
        growing = {(m, r) for m, r, g in zip(q["mode"], q["rate"], q["queue_growing"]) if g}
        df["saturated"] = [bool(s or (m, r) in growing) for m, r, s in zip(df["mode"], df["rate"], df["saturated"])]
    return df.sort_values(["mode", "rate"], key=lambda s: s.map({"on": 0, "off": 1}) if s.name == "mode" else s,
                          ignore_index=True)
