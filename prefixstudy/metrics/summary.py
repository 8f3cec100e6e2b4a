"""One summary.csv row per point, and saturation: defined once, here, for summary.csv and the report."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from prefixstudy.metrics.requests import (KEY, counted, duration_s, hit_rate_estimated, hit_rate_ok, hit_rates,
                                          measured, open_at_end, percentile, split_outcomes)
from prefixstudy.schema import LATENCY_METRICS, PERCENTILES, SUMMARY_COLUMNS

ACHIEVED_MIN_RATIO = 0.95  # achieved below this share of the keep-up rate means the engine fell behind
QUEUE_GROWTH_MIN = 2.0  # requests
QUEUE_GROWTH_REL = 0.5  # of the first-third mean
QUEUE_COLUMNS = ["wait_first", "wait_last", "wait_growth", "queue_growing"]


# ----------------------------------------------------------------- saturation

def _per_s(n: float, seconds: float) -> float:
    return n / seconds if seconds > 0 else math.nan


def keep_up_rate(ok: pd.DataFrame) -> float:
    """The rate an engine that keeps up would achieve on this point's schedule (counted requests).

    n_ok / (schedule span + median E2E), so a Poisson schedule that happens to run a little
    slow is not called saturated.
    """
    if ok.empty:
        return math.nan
    span = float(ok["scheduled_s"].max() - ok["scheduled_s"].min() + ok["e2e_ms"].median() / 1e3)
    return _per_s(len(ok), span)


def arrival_end(requests: pd.DataFrame) -> pd.DataFrame:
    """Per point: the last measured request's scheduled send time (end_s)."""
    m = measured(requests)
    return m.groupby(KEY, sort=True)["scheduled_s"].max().rename("end_s").reset_index()


def _thirds(t: np.ndarray, w: np.ndarray) -> dict:
    t0, t1 = np.nanmin(t), np.nanmax(t)
    third = (t1 - t0) / 3.0
    first, last = w[t <= t0 + third], w[t >= t1 - third]
    wf = float(first.mean()) if first.size else math.nan
    wl = float(last.mean()) if last.size else math.nan
    growth = wl - wf
    growing = bool(third > 0 and growth >= max(QUEUE_GROWTH_MIN, QUEUE_GROWTH_REL * wf))
    return {"wait_first": wf, "wait_last": wl, "wait_growth": growth, "queue_growing": growing}


def queue_growth(iterations: pd.DataFrame, arrival_end: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per point: mean num_waiting over the first and last third of the arrival window.

    The window runs from the point's first iteration to its last arrival
    (``arrival_end``: mode, rate, end_s), so the drain after the last arrival, when
    the queue empties whatever the load, does not hide a growing queue.
    Columns: mode, rate, wait_first, wait_last, wait_growth, queue_growing.
    """
    it = iterations[KEY + ["t_s", "num_waiting"]]
    if arrival_end is not None and len(arrival_end):
        it = it.merge(arrival_end[KEY + ["end_s"]], on=KEY, how="left")
        it = it[~(it["t_s"] > it["end_s"])]
    rows = [{"mode": mode, "rate": float(rate), **_thirds(g["t_s"].to_numpy(float), g["num_waiting"].to_numpy(float))}
            for (mode, rate), g in it.groupby(KEY, sort=True)]
    return pd.DataFrame(rows, columns=KEY + QUEUE_COLUMNS)


def _point_queue(requests: pd.DataFrame, iterations: pd.DataFrame | None) -> dict:
    if iterations is None or not len(iterations):
        return {"wait_first": math.nan, "wait_last": math.nan, "wait_growth": math.nan, "queue_growing": False}
    q = queue_growth(iterations, arrival_end(requests))
    if q.empty:
        return _point_queue(requests, None)
    return {c: q[c].iloc[0] for c in QUEUE_COLUMNS}


def saturation_reason(s: dict) -> str:
    """Why a point is saturated, in words ("" when it is not)."""
    why = []
    if s["below_rate"]:
        why.append(f"achieved {s['achieved_ratio']:.0%} of offered")
    if s["n_unfinished"] > 0:
        why.append(f"{s['n_unfinished']} unfinished")
    if s["queue_growing"]:
        why.append(f"queue grew {s['wait_first']:.1f}->{s['wait_last']:.1f}")
    return "; ".join(why)


def saturation(requests: pd.DataFrame, iterations: pd.DataFrame | None = None,
               achieved_rate: float | None = None) -> dict:
    """One point (its requests and iterations): is it saturated, and why.

    Saturated if any of: achieved rate < ACHIEVED_MIN_RATIO x ``keep_up_rate``; some
    measured request was still open at the point's end (``open_at_end``); the waiting queue
    grows (``queue_growth``).  ``achieved_rate`` defaults to counted / ``duration_s``.
    Keys: achieved_rate, keep_up_rate, achieved_ratio, below_rate, n_unfinished,
    wait_first, wait_last, wait_growth, queue_growing, saturated, reason.
    """
    ok = counted(requests)
    if achieved_rate is None:
        achieved_rate = _per_s(len(ok), duration_s(ok))
    keep_up = keep_up_rate(ok)
    s = {"achieved_rate": achieved_rate, "keep_up_rate": keep_up,
         "achieved_ratio": achieved_rate / keep_up if keep_up else math.nan,
         "below_rate": bool(not math.isnan(keep_up) and achieved_rate < ACHIEVED_MIN_RATIO * keep_up),
         "n_unfinished": int(open_at_end(requests).sum()), **_point_queue(requests, iterations)}
    s["saturated"] = bool(s["below_rate"] or s["n_unfinished"] > 0 or s["queue_growing"])
    s["reason"] = saturation_reason(s)
    return s


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
    """One summary row (schema.SUMMARY_COLUMNS, in order) for one mode x rate.

    ``requests``/``iterations``: this point's rows only.  ``meta``: mode, rate and optionally
    status, error, n_sent, duration_s (used when no request finished).
    """
    ok, n_failed, n_unfinished = split_outcomes(requests)
    duration = duration_s(ok) if not ok.empty else float(meta.get("duration_s", math.nan))
    row: dict = {"mode": meta["mode"], "rate": float(meta["rate"]), "status": meta.get("status", "ok"),
                 "n_sent": int(meta.get("n_sent", len(measured(requests)))), "n_ok": len(ok),
                 "n_failed": n_failed, "n_unfinished": n_unfinished, "duration_s": duration,
                 "achieved_rate": _per_s(len(ok), duration),
                 "output_tok_s": _per_s(float(ok["output_tokens"].sum()), duration), **_latencies(ok)}
    row["prefill_share"] = (row["mean_prefill_ms"] / row["mean_e2e_ms"]) if row["mean_e2e_ms"] else math.nan
    row["hit_rate_measured"], row["hit_rate_expected"] = hit_rates(requests)
    # Checked against what the engine's cache can hold (the LRU estimate); the infinite-cache bound
    # above it is reported, and a gap between the two is eviction, not a failure.
    row["hit_rate_estimated"] = hit_rate_estimated(requests) if meta["mode"] == "on" else row["hit_rate_expected"]
    bound = row["hit_rate_estimated"] if not math.isnan(row["hit_rate_estimated"]) else row["hit_rate_expected"]
    row["hit_rate_ok"] = hit_rate_ok(meta["mode"], row["hit_rate_measured"], bound, tolerance)
    lag = ok["dispatch_lag_ms"]
    row["dispatch_lag_p50_ms"], row["dispatch_lag_p99_ms"] = percentile(lag, 50), percentile(lag, 99)
    sat = saturation(requests, iterations, row["achieved_rate"])
    row["saturated"], row["saturation_reason"] = sat["saturated"], sat["reason"]
    row["error"] = meta.get("error", "") or ""
    return {c: row[c] for c in SUMMARY_COLUMNS}


def _at(df: pd.DataFrame, point: dict) -> pd.DataFrame:
    return df[(df["mode"] == point["mode"]) & (df["rate"] == point["rate"])]


def summarize(requests: pd.DataFrame, points: list[dict], tolerance: float = 0.05,
              iterations: pd.DataFrame | None = None) -> pd.DataFrame:
    """summary.csv: ``summarize_point`` of every point in ``points`` (dicts with mode, rate, status,
    error, n_sent), ON first, then by rate.  Without ``iterations`` the queue is not looked at."""
    rows = [summarize_point(_at(requests, p), p, tolerance,
                            _at(iterations, p) if iterations is not None and len(iterations) else None)
            for p in points]
    df = pd.DataFrame(rows, columns=SUMMARY_COLUMNS)
    return df.sort_values(["mode", "rate"], key=lambda s: s.map({"on": 0, "off": 1}) if s.name == "mode" else s,
                          ignore_index=True)


# ----------------------------------------------------------------- knee and max rates

def knee_rate(points: pd.DataFrame, mode: str) -> float:
    """Highest offered rate below the mode's first saturated rate (see the package docstring).

    ``points``: mode, rate, saturated.  All unsaturated: the highest rate measured.
    """
    p = points[points["mode"] == mode].sort_values("rate")
    knee = math.nan
    for rate, sat in zip(p["rate"], p["saturated"]):
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
