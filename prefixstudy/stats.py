"""Stage: analysis (pure statistics).  DataFrames in, numbers or DataFrames out.

Reads the columns of ``schema.REQUEST_COLUMNS`` / ``ITERATION_COLUMNS`` /
``SUMMARY_COLUMNS``; hands per-point tables to ``plots`` and ``report``.  Nothing
here touches files, clocks or global random state: every bootstrap takes a seed.

Definitions used everywhere (the report quotes them):

* **Counted request**: ``warmup == False`` and ``error == ""``.
* **Percentile**: ``numpy.percentile`` with linear interpolation (vLLM's choice).
* **Saturated point**: achieved rate < ``ACHIEVED_MIN_RATIO`` x the offered rate as
  realized by the schedule (``keep_up_rate``), OR a measured request was left
  unfinished, OR the waiting queue grows through the point: over the arrival window, mean
  ``num_waiting`` of the last third minus that of the first third is at least
  ``QUEUE_GROWTH_MIN`` requests AND at least ``QUEUE_GROWTH_REL`` x the first-third mean.
* **Knee rate** of a mode: the highest offered rate below that mode's first saturated
  rate (every lower rate is unsaturated too).  NaN if the lowest rate is saturated.
* **Max rate meeting a threshold**: the highest offered rate r such that every point
  of that mode at rates <= r is unsaturated and has metric <= threshold.
* **Engine prefill share**: fit ``step_ms = a + b*prompt_tokens + c*generation_tokens``
  by least squares over busy iterations (pooled over both modes: caching changes how
  many prompt tokens are computed, not what one costs); per point the share is
  ``b * sum(prompt_tokens) / sum(step_ms)`` over the same iterations.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from prefixstudy.errors import UserError

ACHIEVED_MIN_RATIO = 0.95
QUEUE_GROWTH_MIN = 2.0  # requests
QUEUE_GROWTH_REL = 0.5  # of the first-third mean
SLO_KEYS = {"ttft": "ttft_ms", "e2e": "e2e_ms", "tpot": "tpot_ms"}
SLO_ALIASES = {"e2el": "e2e"}  # vLLM's --goodput name
KEY = ["mode", "rate"]


# ----------------------------------------------------------------- selection

def counted(requests: pd.DataFrame) -> pd.DataFrame:
    """Requests that count for latency statistics: measured and finished without error."""
    return requests[(~requests["warmup"].astype(bool)) & (requests["error"].astype(str) == "")]


def measured(requests: pd.DataFrame) -> pd.DataFrame:
    return requests[~requests["warmup"].astype(bool)]


def open_at_end(requests: pd.DataFrame) -> pd.Series:
    """Measured requests still open when their point ended.  Only those sent count: they mean the
    engine fell behind; requests the point cap stopped before their send time only mean the cap
    was shorter than the schedule.  One definition for summary.csv and the report."""
    m = measured(requests)
    return m["error"].astype(str).str.startswith("unfinished") & m["sent_s"].notna()


# ----------------------------------------------------------------- percentiles

def percentile(values, q: float) -> float:
    """The q-th percentile (0..100), linear interpolation; NaN for no finite values."""
    a = np.asarray(values, dtype=float)
    a = a[np.isfinite(a)]
    return float(np.percentile(a, q)) if a.size else math.nan


def percentiles(values, qs: Sequence[float] = (50, 90, 99)) -> dict[float, float]:
    a = np.asarray(values, dtype=float)
    a = a[np.isfinite(a)]
    if not a.size:
        return {q: math.nan for q in qs}
    return dict(zip(qs, (float(v) for v in np.percentile(a, list(qs)))))


# ----------------------------------------------------------------- bootstrap

def bootstrap_ci(values, stat: Callable[[np.ndarray], np.ndarray] | None = None, *,
                 n_boot: int = 1000, ci: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap CI of ``stat`` (default: the mean).  Same seed, same answer.

    ``stat`` receives an (n_boot, n) array and must reduce along axis 1.
    """
    a = np.asarray(values, dtype=float)
    a = a[np.isfinite(a)]
    if a.size == 0 or n_boot <= 0:
        return (math.nan, math.nan)
    stat = stat or (lambda x: x.mean(axis=1))
    rng = np.random.default_rng(seed)
    boot = stat(a[rng.integers(0, a.size, size=(n_boot, a.size))])
    lo, hi = np.quantile(boot, [(1 - ci) / 2, 1 - (1 - ci) / 2])
    return (float(lo), float(hi))


def gain(on_values, off_values) -> float:
    """Caching gain (OFF - ON) / OFF of the means: 0.3 means ON is 30 % faster."""
    on = np.asarray(on_values, dtype=float)
    off = np.asarray(off_values, dtype=float)
    on, off = on[np.isfinite(on)], off[np.isfinite(off)]
    if not on.size or not off.size or off.mean() == 0:
        return math.nan
    return float((off.mean() - on.mean()) / off.mean())


def bootstrap_gain_ci(on_values, off_values, *, n_boot: int = 1000, ci: float = 0.95,
                      seed: int = 0) -> tuple[float, float]:
    """Bootstrap CI of ``gain``: ON and OFF resampled independently (stratified).

    Independent resampling does not assume that request i of ON and of OFF saw the
    same load, so it is valid even when some requests failed in one mode only.
    """
    on = np.asarray(on_values, dtype=float)
    off = np.asarray(off_values, dtype=float)
    on, off = on[np.isfinite(on)], off[np.isfinite(off)]
    if not on.size or not off.size or n_boot <= 0:
        return (math.nan, math.nan)
    rng = np.random.default_rng(seed)
    m_on = on[rng.integers(0, on.size, size=(n_boot, on.size))].mean(axis=1)
    m_off = off[rng.integers(0, off.size, size=(n_boot, off.size))].mean(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        g = (m_off - m_on) / m_off
    g = g[np.isfinite(g)]
    if not g.size:
        return (math.nan, math.nan)
    lo, hi = np.quantile(g, [(1 - ci) / 2, 1 - (1 - ci) / 2])
    return (float(lo), float(hi))


def caching_gain(requests: pd.DataFrame, metric: str = "e2e_ms", *, n_boot: int = 1000,
                 ci: float = 0.95, seed: int = 0) -> pd.DataFrame:
    """Per rate: gain of the mean ``metric`` with a bootstrap CI.

    Columns: rate, metric, gain, ci_lo, ci_hi, n_on, n_off.  Each rate gets its own
    generator seeded by (seed, rate index), so adding a rate does not move the others.
    """
    ok = counted(requests)
    rows = []
    for i, rate in enumerate(sorted(ok["rate"].unique())):
        at = ok[ok["rate"] == rate]
        on = at.loc[at["mode"] == "on", metric].to_numpy(float)
        off = at.loc[at["mode"] == "off", metric].to_numpy(float)
        lo, hi = bootstrap_gain_ci(on, off, n_boot=n_boot, ci=ci, seed=_seed(seed, i))
        rows.append({"rate": float(rate), "metric": metric, "gain": gain(on, off),
                     "ci_lo": lo, "ci_hi": hi, "n_on": int(on.size), "n_off": int(off.size)})
    return pd.DataFrame(rows, columns=["rate", "metric", "gain", "ci_lo", "ci_hi", "n_on", "n_off"])


def _seed(seed: int, i: int) -> np.random.SeedSequence:
    return np.random.SeedSequence([int(seed), int(i)])


# ----------------------------------------------------------------- paired comparison

def paired_differences(requests: pd.DataFrame, metric: str = "e2e_ms") -> pd.DataFrame:
    """Pair ON with OFF by (rate, request_index): the same scheduled request in both modes.

    Columns: rate, request_index, on, off, delta (= off - on, so > 0 means ON is faster).
    Only pairs counted in both modes are kept.
    """
    ok = counted(requests)
    on = ok.loc[ok["mode"] == "on", ["rate", "request_index", metric]].rename(columns={metric: "on"})
    off = ok.loc[ok["mode"] == "off", ["rate", "request_index", metric]].rename(columns={metric: "off"})
    p = on.merge(off, on=["rate", "request_index"], how="inner").sort_values(["rate", "request_index"])
    p["delta"] = p["off"] - p["on"]
    return p.reset_index(drop=True)


def paired_summary(pairs: pd.DataFrame) -> pd.DataFrame:
    """Per rate: n_pairs, mean/median/p10/p90 of delta, share of pairs where ON was faster."""
    rows = []
    for rate, g in pairs.groupby("rate", sort=True):
        d = g["delta"].to_numpy(float)
        q = percentiles(d, (10, 50, 90))
        rows.append({"rate": float(rate), "n_pairs": int(d.size), "mean_delta": float(d.mean()),
                     "median_delta": q[50], "p10_delta": q[10], "p90_delta": q[90],
                     "on_faster_share": float((d > 0).mean())})
    return pd.DataFrame(rows, columns=["rate", "n_pairs", "mean_delta", "median_delta",
                                       "p10_delta", "p90_delta", "on_faster_share"])


# ----------------------------------------------------------------- SLOs and goodput

def parse_slo(text: str | None) -> dict[str, float]:
    """``"ttft=200,e2e=2000"`` -> ``{"ttft": 200.0, "e2e": 2000.0}`` (milliseconds).

    Keys: ttft, e2e (alias e2el), tpot.  Separators ``=`` or ``:``.
    """
    if text is None or not str(text).strip():
        return {}
    out: dict[str, float] = {}
    for part in str(text).split(","):
        part = part.strip()
        m = re.fullmatch(r"([A-Za-z0-9_]+)\s*[=:]\s*([^=:]+)", part)
        if not m:
            raise UserError(f"--slo '{text}': '{part}' is not KEY=MS (e.g. --slo ttft=200,e2e=2000)")
        key = SLO_ALIASES.get(m.group(1).lower(), m.group(1).lower())
        if key not in SLO_KEYS:
            raise UserError(f"--slo '{text}': unknown key '{m.group(1)}'; use {', '.join(SLO_KEYS)}")
        try:
            val = float(m.group(2).strip().removesuffix("ms"))
        except ValueError:
            raise UserError(f"--slo '{text}': '{m.group(2).strip()}' is not a number of milliseconds") from None
        if not (val > 0 and math.isfinite(val)):
            raise UserError(f"--slo '{text}': {key} must be a finite number > 0 ms, got {m.group(2).strip()}")
        if key in out:
            raise UserError(f"--slo '{text}': '{key}' given twice")
        out[key] = val
    return out


def meets_slo(requests: pd.DataFrame, slo: Mapping[str, float]) -> pd.Series:
    """Per request: counted and within every SLO.  A NaN tpot (one output token) counts as 0, as in vLLM."""
    good = (~requests["warmup"].astype(bool)) & (requests["error"].astype(str) == "")
    for key, limit in slo.items():
        col = requests[SLO_KEYS[key]].astype(float)
        if key == "tpot":
            col = col.fillna(0.0)
        good &= col <= limit
    return good


def point_span_s(requests: pd.DataFrame) -> pd.DataFrame:
    """Per point: seconds from the first measured send to the last counted completion."""
    m = measured(requests)
    end = m["sent_s"] + m["e2e_ms"].astype(float).fillna(0.0) / 1000.0
    g = pd.DataFrame({"mode": m["mode"], "rate": m["rate"], "start": m["sent_s"], "end": end})
    g = g.groupby(KEY, sort=True).agg(start=("start", "min"), end=("end", "max")).reset_index()
    g["duration_s"] = g["end"] - g["start"]
    return g[KEY + ["duration_s"]]


def goodput(requests: pd.DataFrame, slo: Mapping[str, float],
            durations: pd.DataFrame | None = None) -> pd.DataFrame:
    """Requests per second meeting every SLO, over the point's duration.

    ``durations`` (mode, rate, duration_s), e.g. summary.csv, overrides ``point_span_s``.
    Columns: mode, rate, n_good, n_measured, duration_s, goodput_rps.
    """
    m = measured(requests)
    good = meets_slo(m, slo)
    g = pd.DataFrame({"mode": m["mode"], "rate": m["rate"], "good": good.astype(int)})
    g = g.groupby(KEY, sort=True).agg(n_good=("good", "sum"), n_measured=("good", "size")).reset_index()
    dur = durations[KEY + ["duration_s"]] if durations is not None else point_span_s(requests)
    g = g.merge(dur, on=KEY, how="left")
    g["goodput_rps"] = np.where(g["duration_s"] > 0, g["n_good"] / g["duration_s"], np.nan)
    return g


# ----------------------------------------------------------------- per-point table

def point_stats(requests: pd.DataFrame) -> pd.DataFrame:
    """Summary-like statistics per (mode, rate) from counted requests alone.

    Used where summary.csv lacks a value; summary.csv wins where it has one.
    """
    m = measured(requests)
    ok = counted(requests)
    span = point_span_s(requests)
    n = m.groupby(KEY).size().rename("n_sent")
    n_ok = ok.groupby(KEY).size().rename("n_ok")
    out = span.merge(n.reset_index(), on=KEY, how="outer").merge(n_ok.reset_index(), on=KEY, how="left")
    out["n_ok"] = out["n_ok"].fillna(0).astype(int)
    out["achieved_rate"] = np.where(out["duration_s"] > 0, out["n_ok"] / out["duration_s"], np.nan)
    cols = {}
    for metric in ("ttft", "tpot", "e2e", "queue", "prefill", "decode"):
        grp = ok.groupby(KEY)[f"{metric}_ms"]
        cols[f"mean_{metric}_ms"] = grp.mean()
        for q in (50, 90, 99):
            cols[f"p{q}_{metric}_ms"] = grp.quantile(q / 100.0)  # linear, same as np.percentile
    if cols:
        out = out.merge(pd.DataFrame(cols).reset_index(), on=KEY, how="left")
    out["prefill_share_req"] = out["mean_prefill_ms"] / out["mean_e2e_ms"]
    return out.sort_values(KEY).reset_index(drop=True)


def request_prefill_share(requests: pd.DataFrame) -> pd.DataFrame:
    """Request-level prefill share per point: mean(prefill_ms) / mean(e2e_ms) over counted requests."""
    ok = counted(requests)
    g = ok.groupby(KEY, sort=True).agg(prefill=("prefill_ms", "mean"), e2e=("e2e_ms", "mean")).reset_index()
    g["prefill_share_req"] = g["prefill"] / g["e2e"]
    return g[KEY + ["prefill_share_req"]]


# ----------------------------------------------------------------- saturation

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
    rows = []
    for (mode, rate), g in it.groupby(KEY, sort=True):
        t = g["t_s"].to_numpy(float)
        w = g["num_waiting"].to_numpy(float)
        t0, t1 = np.nanmin(t), np.nanmax(t)
        third = (t1 - t0) / 3.0
        first = w[t <= t0 + third]
        last = w[t >= t1 - third]
        wf = float(first.mean()) if first.size else math.nan
        wl = float(last.mean()) if last.size else math.nan
        growth = wl - wf
        growing = bool(third > 0 and growth >= max(QUEUE_GROWTH_MIN, QUEUE_GROWTH_REL * wf))
        rows.append({"mode": mode, "rate": float(rate), "wait_first": wf, "wait_last": wl,
                     "wait_growth": growth, "queue_growing": growing})
    return pd.DataFrame(rows, columns=KEY + ["wait_first", "wait_last", "wait_growth", "queue_growing"])


def arrival_end(requests: pd.DataFrame) -> pd.DataFrame:
    """Per point: the last measured request's scheduled send time (end_s)."""
    m = measured(requests)
    return m.groupby(KEY, sort=True)["scheduled_s"].max().rename("end_s").reset_index()


def keep_up_rate(requests: pd.DataFrame) -> pd.DataFrame:
    """Per point: the rate an engine that keeps up would achieve on this schedule.

    n_ok / (schedule span + median E2E), the same reference as analysis.summarize, so
    a Poisson schedule that happens to run a little slow is not called saturated.
    """
    ok = counted(requests)
    rows = []
    for (mode, rate), g in ok.groupby(KEY, sort=True):
        span = g["scheduled_s"].max() - g["scheduled_s"].min() + g["e2e_ms"].median() / 1000.0
        rows.append({"mode": mode, "rate": float(rate), "keep_up_rate": len(g) / span if span > 0 else math.nan})
    return pd.DataFrame(rows, columns=KEY + ["keep_up_rate"])


def saturation(requests: pd.DataFrame, iterations: pd.DataFrame,
               achieved: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per point: is it saturated, and why.

    Saturated if any of: achieved rate < ACHIEVED_MIN_RATIO x ``keep_up_rate``; some
    measured request was cancelled unfinished at the point's end; the waiting queue
    grows (``queue_growth``).  ``achieved`` (mode, rate, achieved_rate), e.g.
    summary.csv, overrides the achieved rate computed here (counted / point span).
    Columns: mode, rate, achieved_rate, keep_up_rate, achieved_ratio, below_rate,
    n_unfinished, wait_first, wait_last, wait_growth, queue_growing, saturated, reason.
    """
    if achieved is not None and "achieved_rate" in achieved:
        ach = achieved[KEY + ["achieved_rate"]]
    else:
        ach = point_stats(requests)[KEY + ["achieved_rate"]]
    m = measured(requests)
    unf = open_at_end(requests).groupby([m["mode"], m["rate"]]).sum()
    unf = unf.rename("n_unfinished").reset_index()
    q = queue_growth(iterations, arrival_end(requests))
    out = (ach.merge(keep_up_rate(requests), on=KEY, how="outer").merge(unf, on=KEY, how="left")
           .merge(q, on=KEY, how="outer").sort_values(KEY).reset_index(drop=True))
    out["n_unfinished"] = out["n_unfinished"].fillna(0).astype(int)
    out["achieved_ratio"] = out["achieved_rate"] / out["keep_up_rate"]
    out["below_rate"] = (out["achieved_ratio"] < ACHIEVED_MIN_RATIO).fillna(False).astype(bool)
    out["queue_growing"] = out["queue_growing"].fillna(False).astype(bool)
    out["saturated"] = out["below_rate"] | out["queue_growing"] | (out["n_unfinished"] > 0)
    reasons = []
    for _, r in out.iterrows():
        why = []
        if r["below_rate"]:
            why.append(f"achieved {r['achieved_ratio']:.0%} of offered")
        if r["n_unfinished"] > 0:
            why.append(f"{r['n_unfinished']} unfinished")
        if r["queue_growing"]:
            why.append(f"queue grew {r['wait_first']:.1f}->{r['wait_last']:.1f}")
        reasons.append("; ".join(why))
    out["reason"] = reasons
    return out[KEY + ["achieved_rate", "keep_up_rate", "achieved_ratio", "below_rate", "n_unfinished",
                      "wait_first", "wait_last", "wait_growth", "queue_growing", "saturated", "reason"]]


def knee_rate(points: pd.DataFrame, mode: str) -> float:
    """Highest offered rate below the mode's first saturated rate (see module docstring).

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


# ----------------------------------------------------------------- engine prefill share

def _busy(iterations: pd.DataFrame) -> pd.DataFrame:
    it = iterations
    step = it["step_ms"].astype(float)
    work = it["prompt_tokens"].astype(float) + it["generation_tokens"].astype(float)
    return it[np.isfinite(step) & (step > 0) & (work > 0)]


def fit_step_cost(iterations: pd.DataFrame, by: str | None = None) -> pd.DataFrame:
    """Least squares ``step_ms = a + b*prompt_tokens + c*generation_tokens`` over busy iterations.

    Busy: finite step_ms > 0 and at least one token computed.  ``by=None`` pools all
    rows (group "pooled"); ``by="mode"`` fits each mode.  Columns: group, a_ms,
    b_ms_per_prompt_token, c_ms_per_gen_token, r2, n.  NaN coefficients when the
    design is rank-deficient (e.g. prompt_tokens constant).
    """
    busy = _busy(iterations)
    groups = [("pooled", busy)] if by is None else list(busy.groupby(by, sort=True))
    rows = []
    for name, g in groups:
        X = np.column_stack([np.ones(len(g)), g["prompt_tokens"].to_numpy(float),
                             g["generation_tokens"].to_numpy(float)])
        y = g["step_ms"].to_numpy(float)
        coef = np.full(3, math.nan)
        r2 = math.nan
        if len(g) >= 3 and np.linalg.matrix_rank(X) == 3:
            coef, *_ = np.linalg.lstsq(X, y, rcond=None)
            ss_tot = float(((y - y.mean()) ** 2).sum())
            ss_res = float(((y - X @ coef) ** 2).sum())
            r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
        rows.append({"group": name, "a_ms": float(coef[0]), "b_ms_per_prompt_token": float(coef[1]),
                     "c_ms_per_gen_token": float(coef[2]), "r2": r2, "n": int(len(g))})
    return pd.DataFrame(rows, columns=["group", "a_ms", "b_ms_per_prompt_token",
                                       "c_ms_per_gen_token", "r2", "n"])


def engine_prefill_share(iterations: pd.DataFrame, fit: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per point: b * sum(prompt_tokens) / sum(step_ms) over busy iterations.

    ``fit`` defaults to the pooled ``fit_step_cost``.  Columns: mode, rate,
    prompt_tokens, busy_ms, prefill_share_engine.
    """
    fit = fit_step_cost(iterations) if fit is None else fit
    b = float(fit["b_ms_per_prompt_token"].iloc[0])
    busy = _busy(iterations)
    g = busy.groupby(KEY, sort=True).agg(prompt_tokens=("prompt_tokens", "sum"),
                                         busy_ms=("step_ms", "sum")).reset_index()
    g["prefill_share_engine"] = b * g["prompt_tokens"] / g["busy_ms"]
    return g
