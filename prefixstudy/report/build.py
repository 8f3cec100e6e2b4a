"""Stage: output (report).  A results folder in, report.md + report.html out.

``build_report(results_dir)`` loads the study (``prefixstudy.results.load``), merges
summary.csv with statistics recomputed from the requests (summary.csv wins wherever
it has a value, so every number quoted agrees with it), draws the figures
(``prefixstudy.plots``) into ``RESULTS/plots/`` as PNG and SVG, and writes:

* ``report.md``: figures linked from ``plots/``;
* ``report.html``: self-contained, every figure embedded as a base64 PNG.

``build_compare(dirs, out)`` overlays several studies in one report.
Both documents are rendered from one list of blocks, so they never disagree.
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from prefixstudy import stats
from prefixstudy.report import figures as plots
from prefixstudy.errors import UserError
from prefixstudy.results import StudyResults, atomic_write_text, load

KEY = ["mode", "rate"]
PLOTS_DIR = "plots"
REPORT_MD = "report.md"
REPORT_HTML = "report.html"
SAT_MARK = "⚠"  # marks a saturated point in every table
FORMATS = ("png", "svg")

ESTIMATOR_TEXT = (
    "Engine-level prefill share: we fit step_ms = a + b·prompt_tokens + c·generation_tokens "
    "by ordinary least squares over every busy engine iteration (finite step_ms > 0 and at least "
    "one token computed), pooled over both modes, because prefix caching changes how many prompt "
    "tokens are computed, not what computing one costs; pooling also spans a wider range of "
    "prompt-token counts, which makes b better determined. For each point the share is "
    "b·Σprompt_tokens / Σstep_ms over that point's busy iterations: the fraction of engine busy "
    "time spent computing prompt tokens. Caveats: step_ms is the time between two engine "
    "records, so host overhead lands in a; attention cost grows with context length, which a "
    "linear model averages over. Per-mode fits are shown for comparison. Request-level prefill "
    "share is mean(prefill_ms) / mean(e2e_ms) over counted requests."
)
SATURATION_TEXT = (
    f"A point is saturated when its achieved rate is below {stats.ACHIEVED_MIN_RATIO:.0%} of the "
    f"offered rate, or when the waiting queue keeps growing: over the arrival window (first "
    f"iteration to last scheduled arrival), mean num_waiting of the last third exceeds that of "
    f"the first third by at least {stats.QUEUE_GROWTH_MIN:g} requests and by at least "
    f"{stats.QUEUE_GROWTH_REL:.0%}. The knee rate of a mode is the highest offered rate below "
    f"its first saturated rate. The saturated flag shown is summary.csv's where it has one."
)


# ----------------------------------------------------------------- analysis

@dataclass
class ReportData:
    """Everything the report shows for one study; no figures, no files."""

    study: StudyResults
    label: str
    points: pd.DataFrame  # one row per finished (mode, rate): summary.csv merged with recomputed stats
    manifest_points: pd.DataFrame  # mode, rate, status, error: every point the run knows of
    knees: dict[str, float]
    fit: pd.DataFrame  # pooled fit, then per-mode fits
    gains: pd.DataFrame
    paired: pd.DataFrame
    slo: dict[str, float]
    threshold_ms: float
    threshold_source: str
    curves: dict[str, pd.DataFrame]
    headline: dict[str, Any]
    notes: list[str] = field(default_factory=list)


def _norm_rate(df: pd.DataFrame) -> pd.DataFrame:
    if "rate" in df:
        df = df.copy()
        df["rate"] = df["rate"].astype(float).round(9)
    return df


def _as_bool(s: pd.Series) -> pd.Series:
    """summary.csv's saturated column: bool, 'True'/'False' text or empty."""
    def one(v):
        if isinstance(v, (bool, np.bool_)):
            return bool(v)
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return None
        t = str(v).strip().lower()
        return True if t in ("true", "1", "yes") else False if t in ("false", "0", "no") else None
    return s.map(one).astype(object)


def merge_points(study: StudyResults) -> tuple[pd.DataFrame, list[str]]:
    """Per-point table: recomputed statistics, overridden by summary.csv wherever it has a value."""
    notes = []
    req = _norm_rate(study.requests)
    it = _norm_rate(study.iterations)
    own = stats.point_stats(req)
    summ = _norm_rate(study.summary)
    if len(summ):
        summ = summ.drop_duplicates(KEY, keep="last")
        own = own.merge(summ[KEY], on=KEY, how="outer")
        s = summ.set_index(KEY)
        o = own.set_index(KEY)
        for col in s.columns:
            if col == "saturated":
                continue
            if col in o and pd.api.types.is_numeric_dtype(s[col]):
                o[col] = s[col].reindex(o.index).where(s[col].reindex(o.index).notna(), o[col])
            else:
                o[col] = s[col].reindex(o.index)
        own = o.reset_index()
    else:
        notes.append("summary.csv is empty or missing: every statistic is recomputed from requests.parquet.")
    if "status" not in own:
        own["status"] = "ok"
    own["status"] = own["status"].astype(object).where(own["status"].notna(), "ok").astype(str)
    if "error" not in own:
        own["error"] = ""
    own["error"] = own["error"].astype(object).where(own["error"].notna(), "").astype(str)
    sat = stats.saturation(req, it, achieved=own[KEY + ["achieved_rate"]])
    own = own.merge(sat.drop(columns=["achieved_rate"]), on=KEY, how="left")
    own["saturated_stats"] = own["saturated"].fillna(False).astype(bool)
    own = own.drop(columns=["saturated"])
    from_summary = (_as_bool(summ.set_index(KEY)["saturated"]).reindex(own.set_index(KEY).index)
                    if len(summ) and "saturated" in summ else pd.Series([None] * len(own)))
    own["saturated"] = [bool(s) if s is not None else bool(t)
                        for s, t in zip(from_summary.to_numpy(), own["saturated_stats"])]
    differ = own[own["saturated"] != own["saturated_stats"]]
    for _, r in differ.iterrows():
        notes.append(f"{r['mode']} @ {r['rate']:g} req/s: summary.csv says saturated={r['saturated']}, "
                     f"the report's own test says {r['saturated_stats']} ({r['reason'] or 'no reason'}); "
                     f"summary.csv's flag is used.")
    own["reason"] = own["reason"].fillna("")
    share = stats.engine_prefill_share(it) if len(it) else pd.DataFrame(columns=KEY + ["prefill_share_engine"])
    own = own.merge(share[KEY + ["prefill_share_engine"]], on=KEY, how="left")
    return own.sort_values(KEY).reset_index(drop=True), notes


def manifest_points(study: StudyResults, points: pd.DataFrame) -> pd.DataFrame:
    rows = [{"mode": str(p.get("mode", "")), "rate": float(p.get("rate", math.nan)),
             "status": str(p.get("status", "")), "error": str(p.get("error") or "")}
            for p in study.manifest.get("points", []) or [] if isinstance(p, dict)]
    mp = pd.DataFrame(rows, columns=["mode", "rate", "status", "error"])
    mp = _norm_rate(mp)
    known = points[KEY + ["status", "error"]]
    mp = pd.concat([mp, known[~known.set_index(KEY).index.isin(mp.set_index(KEY).index)]])
    return mp.sort_values(KEY).reset_index(drop=True)


def study_label(study: StudyResults) -> str:
    """'study / device / TP=n' from config and manifest."""
    cfg, man = study.config, study.manifest
    tp = (cfg.get("engine") or {}).get("tensor_parallel_size", 1)
    name = cfg.get("study") or study.path.parent.name or study.path.name
    return f"{name} / {man.get('device') or 'unknown device'} / TP={tp}"


def choose_threshold(points: pd.DataFrame, slo: dict[str, float], threshold_ms: float | None) -> tuple[float, str]:
    """The p90 E2E threshold Y of the headline, and where it comes from."""
    if threshold_ms is not None:
        return float(threshold_ms), "given with --threshold"
    if "e2e" in slo:
        return float(slo["e2e"]), "the e2e SLO"
    for mode in ("off", "on"):
        p = points[(points["mode"] == mode) & points["p90_e2e_ms"].notna()].sort_values("rate")
        if len(p):
            r = p.iloc[0]
            return (2.0 * float(r["p90_e2e_ms"]),
                    f"2 × caching {mode.upper()}'s p90 E2E at its lowest rate "
                    f"({r['rate']:g} req/s: {r['p90_e2e_ms']:.1f} ms)")
    return math.nan, "no finished point"


def _thresholds(values) -> np.ndarray:
    v = np.asarray(values, dtype=float)
    v = np.unique(v[np.isfinite(v) & (v > 0)])
    if not v.size:
        return v
    return np.unique(np.concatenate([[v.min() * 0.7], v, [v.max() * 1.5]]))


def analyze(study: StudyResults, slo: dict[str, float] | None = None, threshold_ms: float | None = None,
            n_boot: int = 1000, seed: int = 0) -> ReportData:
    slo = dict(slo or {})
    points, notes = merge_points(study)
    done = points[points["status"] != "failed"]
    knees = {m: stats.knee_rate(done, m) for m in plots.MODES}
    y, y_src = choose_threshold(done, slo, threshold_ms)
    headline = {"threshold_ms": y, "threshold_source": y_src, "knees": knees,
                "sustains": {m: stats.max_rate_meeting(done, "p90_e2e_ms", y, m) if math.isfinite(y)
                             else math.nan for m in plots.MODES}}
    req = _norm_rate(study.requests)
    if slo:
        dur = points[KEY + ["duration_s"]]
        gp = stats.goodput(req, slo, durations=dur)
        points = points.merge(gp[KEY + ["n_good", "goodput_rps"]], on=KEY, how="left")
    gains = pd.concat([stats.caching_gain(req, "e2e_ms", n_boot=n_boot, seed=seed),
                       stats.caching_gain(req, "ttft_ms", n_boot=n_boot, seed=seed + 1)], ignore_index=True)
    pe = stats.paired_summary(stats.paired_differences(req, "e2e_ms"))
    pt = stats.paired_summary(stats.paired_differences(req, "ttft_ms"))
    paired = pe.merge(pt[["rate", "mean_delta", "median_delta"]].rename(
        columns={"mean_delta": "mean_delta_ttft", "median_delta": "median_delta_ttft"}), on="rate", how="left")
    it = _norm_rate(study.iterations)
    fit = pd.concat([stats.fit_step_cost(it), stats.fit_step_cost(it, by="mode")], ignore_index=True) \
        if len(it) else pd.DataFrame()
    if len(fit):
        pooled = fit.iloc[0]
        coef = pooled[["a_ms", "b_ms_per_prompt_token", "c_ms_per_gen_token"]].astype(float)
        if not np.isfinite(coef).all():
            notes.append("The step-time fit is undetermined (too few busy iterations, or prompt and generated "
                         "token counts that do not vary independently); no engine-level prefill share.")
        elif pooled["r2"] < 0.5 or (coef < 0).any():
            notes.append(f"The pooled step-time fit is poor (R² = {pooled['r2']:.2f}"
                         + (", a negative coefficient" if (coef < 0).any() else "")
                         + "); read the engine-level prefill share as rough.")
    curves = {
        "p90 E2E": stats.max_rate_curve(done, "p90_e2e_ms", _thresholds(done["p90_e2e_ms"])),
        "p90 TTFT": stats.max_rate_curve(done, "p90_ttft_ms", _thresholds(done["p90_ttft_ms"])),
    }
    return ReportData(study, study_label(study), points, manifest_points(study, points), knees, fit, gains,
                      paired, slo, y, y_src, curves, headline, notes)


def default_point(points: pd.DataFrame) -> float:
    """Highest rate at which both modes are unsaturated, else the highest rate."""
    done = points[points["status"] != "failed"]
    rates = sorted(done["rate"].unique())
    if not rates:
        raise UserError("no finished points to draw")
    both = [r for r in rates
            if set(done.loc[(done["rate"] == r) & ~done["saturated"].astype(bool), "mode"]) >= set(done["mode"])]
    return float(both[-1]) if both else float(rates[-1])


def parse_point(text: str | None) -> tuple[str | None, float] | None:
    """``--point``: "8", "on 8", "off:8", "on=8" -> (mode or None, rate)."""
    if text is None or not str(text).strip():
        return None
    m = re.fullmatch(r"\s*(?:(on|off)\s*[:=,@ ]\s*)?([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*", str(text), re.I)
    if not m:
        raise UserError(f"--point '{text}': expected [MODE] RATE, e.g. --point 8 or --point 'on 8'")
    return (m.group(1).lower() if m.group(1) else None, float(m.group(2)))


# ----------------------------------------------------------------- blocks

@dataclass
class SavedFigure:
    stem: str
    caption: str
    paths: list[Path]


def _fmt(v, spec: str = ".1f") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    try:
        return format(v, spec)
    except (TypeError, ValueError):
        return str(v)


def _rate(r: float) -> str:
    return f"{r:g}" if math.isfinite(r) else "no measured rate"


def _rates_list(rates) -> str:
    return ", ".join(f"{r:g}" for r in rates) + " req/s"


def _pct(v) -> str:
    return _fmt(100 * v, ".0f") + " %" if v is not None and math.isfinite(v) else "–"


def headline_paragraphs(d: ReportData) -> list[str]:
    h = d.headline
    y = h["threshold_ms"]
    out = []
    sus = h["sustains"]
    if math.isfinite(y):
        out.append(f"Caching ON sustains {_rate(sus['on'])} req/s at p90 E2E ≤ {y:.1f} ms; "
                   f"OFF sustains {_rate(sus['off'])} req/s. Threshold: {h['threshold_source']}. "
                   "A rate counts only if it and every lower rate of that mode meet the threshold and are "
                   "unsaturated.")
    done = d.points[d.points["status"] != "failed"]
    for mode in plots.MODES:
        p = done[done["mode"] == mode]
        if p.empty:
            continue
        sat = p[p["saturated"]]
        knee = d.knees[mode]
        knee_txt = (f"knee rate {_rate(knee)} req/s" if math.isfinite(knee)
                    else "no knee: already saturated at the lowest rate")
        if sat.empty:
            out.append(f"Caching {mode.upper()}: no point saturated (up to {p['rate'].max():g} req/s); "
                       f"knee rate ≥ {p['rate'].max():g} req/s.")
        else:
            why = "; ".join(f"{r['rate']:g}: {r['reason'] or 'summary.csv'}" for _, r in sat.iterrows())
            out.append(f"Caching {mode.upper()}: saturated at {_rates_list(sat['rate'])} ({why}); {knee_txt}.")
    failed = d.manifest_points[d.manifest_points["status"].isin(["failed", "interrupted"])]
    if len(failed):
        out.append("Points that did not finish: " + "; ".join(
            f"{r['mode']} @ {r['rate']:g} req/s {r['status']}" + (f" ({r['error']})" if r["error"] else "")
            for _, r in failed.iterrows()) + ".")
    return out


def _mark(rate: float, sat: bool) -> str:
    return f"{SAT_MARK} {rate:g}" if sat else f"{rate:g}"


def points_table(d: ReportData) -> pd.DataFrame:
    p = d.points
    t = pd.DataFrame({
        "mode": p["mode"].str.upper(),
        "rate (req/s)": [_mark(r, s) for r, s in zip(p["rate"], p["saturated"])],
        "status": p["status"],
        "ok": p["n_ok"].map(lambda v: _fmt(v, ".0f")),
        "achieved (req/s)": p["achieved_rate"].map(lambda v: _fmt(v, ".2f")),
        "mean E2E (ms)": p["mean_e2e_ms"].map(_fmt),
        "p90 E2E (ms)": p["p90_e2e_ms"].map(_fmt),
        "p99 E2E (ms)": p["p99_e2e_ms"].map(_fmt),
        "mean TTFT (ms)": p["mean_ttft_ms"].map(_fmt),
        "p90 TTFT (ms)": p["p90_ttft_ms"].map(_fmt),
        "p99 TTFT (ms)": p["p99_ttft_ms"].map(_fmt),
        "queue / prefill / decode (ms)": [f"{_fmt(a)} / {_fmt(b)} / {_fmt(c)}" for a, b, c in
                                          zip(p["mean_queue_ms"], p["mean_prefill_ms"], p["mean_decode_ms"])],
    })
    if "goodput_rps" in p:
        t["goodput (req/s)"] = p["goodput_rps"].map(lambda v: _fmt(v, ".2f"))
    t["saturated"] = [("yes" + (f": {r}" if r else "")) if s else "no" for s, r in zip(p["saturated"], p["reason"])]
    return t


def prefill_table(d: ReportData) -> pd.DataFrame:
    p = d.points
    return pd.DataFrame({
        "mode": p["mode"].str.upper(),
        "rate (req/s)": [_mark(r, s) for r, s in zip(p["rate"], p["saturated"])],
        "request level: mean prefill / mean E2E": p["prefill_share_req"].map(_pct),
        "engine level: b·Σprompt / Σstep": p["prefill_share_engine"].map(_pct),
    })


def fit_table(d: ReportData) -> pd.DataFrame:
    f = d.fit
    if f.empty:
        return f
    return pd.DataFrame({
        "fit": f["group"].map(lambda g: "pooled (used)" if g == "pooled" else f"{g.upper()} only"),
        "a (ms/step)": f["a_ms"].map(lambda v: _fmt(v, ".3f")),
        "b (ms/prompt token)": f["b_ms_per_prompt_token"].map(lambda v: _fmt(v, ".5f")),
        "c (ms/generated token)": f["c_ms_per_gen_token"].map(lambda v: _fmt(v, ".4f")),
        "R²": f["r2"].map(lambda v: _fmt(v, ".3f")),
        "iterations": f["n"].astype(str),
    })


def gain_table(d: ReportData) -> pd.DataFrame:
    g = d.gains
    sat_rates = set(d.points.loc[d.points["saturated"], "rate"])
    rows = []
    for rate in sorted(g["rate"].unique()):
        row = {"rate (req/s)": _mark(rate, rate in sat_rates)}
        for metric, name in (("e2e_ms", "E2E"), ("ttft_ms", "TTFT")):
            r = g[(g["rate"] == rate) & (g["metric"] == metric)]
            if len(r):
                r = r.iloc[0]
                row[f"{name} gain [95% CI]"] = f"{_pct(r['gain'])} [{_pct(r['ci_lo'])}, {_pct(r['ci_hi'])}]"
        pr = d.paired[d.paired["rate"] == rate]
        if len(pr):
            pr = pr.iloc[0]
            row["pairs"] = str(int(pr["n_pairs"]))
            row["paired ΔE2E mean / median (ms)"] = f"{_fmt(pr['mean_delta'])} / {_fmt(pr['median_delta'])}"
            row["paired ΔTTFT mean (ms)"] = _fmt(pr["mean_delta_ttft"])
            row["ON faster"] = _pct(pr["on_faster_share"])
        rows.append(row)
    return pd.DataFrame(rows)


def all_points_table(d: ReportData) -> pd.DataFrame:
    mp = d.manifest_points
    sat = d.points.set_index(KEY)["saturated"]
    return pd.DataFrame({
        "point": [f"{m.upper()} @ {r:g} req/s" for m, r in zip(mp["mode"], mp["rate"])],
        "status": mp["status"],
        "saturated": ["yes" if sat.get((m, r), False) else "no" for m, r in zip(mp["mode"], mp["rate"])],
        "error": mp["error"],
    })


# ----------------------------------------------------------------- figures

def draw_figures(d: ReportData, out_dir: Path, peers: pd.DataFrame | None = None,
                 point: tuple[str | None, float] | None = None,
                 formats: Sequence[str] = FORMATS) -> list[SavedFigure]:
    plots_dir = out_dir / PLOTS_DIR
    done = d.points[d.points["status"] != "failed"]
    sat_rates = sorted(set(done.loc[done["saturated"], "rate"]))
    sat_map = {(m, float(r)): bool(s) for m, r, s in zip(done["mode"], done["rate"], done["saturated"])}
    req_ok = stats.counted(_norm_rate(d.study.requests))
    it = _norm_rate(d.study.iterations)
    mode_sel, rate = (None, default_point(done)) if point is None else point
    if point is not None and not np.isclose(done["rate"], rate).any():
        raise UserError(f"--point {rate:g}: no finished point at that rate; rates: {_rates_list(sorted(done['rate'].unique()))}")
    rate = float(done["rate"].to_numpy()[np.argmin(np.abs(done["rate"].to_numpy() - rate))])
    ts_modes = (mode_sel,) if mode_sel else plots.MODES
    which = "chosen with --point" if point else "the highest rate at which both modes are unsaturated (else the highest)"
    specs = [
        ("e2e_vs_rate", lambda: plots.e2e_vs_rate(done, peers),
         "Figure 1. Mean (solid) and p99 (dashed) end-to-end latency vs offered rate."),
        ("ttft_vs_rate", lambda: plots.ttft_vs_rate(done, peers),
         "Figure 2. Mean (solid) and p99 (dashed) time to first token vs offered rate."),
        ("latency_breakdown", lambda: plots.latency_breakdown(done),
         "Figure 3. Mean queue / prefill / decode time per request; the label is the request-level prefill share."),
        ("max_rate_vs_threshold", lambda: plots.max_rate_vs_threshold(d.curves, d.knees),
         "Figure 4. Highest offered rate whose p90 E2E (left) / p90 TTFT (right) meets a threshold, "
         "vs the threshold; dotted: knee rate."),
        ("caching_gain", lambda: plots.caching_gain(d.gains, sat_rates),
         "Figure 5. Caching gain (OFF − ON) / OFF of mean E2E and mean TTFT, with seeded bootstrap 95 % CIs."),
        ("engine_timeseries", lambda: plots.engine_timeseries(
            it, rate, {m: sat_map.get((m, rate), False) for m in plots.MODES}, ts_modes),
         f"Figure 6. Engine state over time at {rate:g} req/s ({which})."),
        ("e2e_cdf", lambda: plots.e2e_cdf(req_ok, sat_map),
         "Figure 7. CDF of end-to-end latency at each offered rate."),
        ("prefill_share", lambda: plots.prefill_share(done),
         "Figure 8. Prefill share vs rate: request level (solid) and engine level (dashed)."),
    ]
    return [SavedFigure(stem, caption, plots.save(make(), plots_dir / stem, formats)) for stem, make, caption in specs]


# ----------------------------------------------------------------- model vs measurement

def model_section(d: ReportData) -> tuple[list[str], pd.DataFrame | None]:
    device = str(d.study.manifest.get("device") or (d.study.config or {}).get("device") or "")
    try:
        from prefixstudy.model import gpus
        known = gpus.find_gpu(device) is not None if device else False
    except (ImportError, AttributeError):
        known = False
    if not known:
        return [], None
    try:
        from prefixstudy.model.roofline import model_vs_measurement
    except (ImportError, AttributeError):
        return [f"Device {device} is a known GPU, but prefixstudy.model.model_vs_measurement is not available."], None
    try:
        df = model_vs_measurement(d.points, d.study.requests, d.study.iterations, d.study.config, device)
    except Exception as e:  # the model is someone else's stage: report, don't crash the report
        return [f"model_vs_measurement failed on {device}: {e.__class__.__name__}: {e}"], None
    if df is None or len(df) == 0:
        return [f"The performance model has no prediction for {device}."], None
    return [f"First-principles model (prefixstudy.model) for {device} against the measurement."], df


# ----------------------------------------------------------------- rendering

def _md_cell(v: Any) -> str:
    return str(v).replace("|", "\\|").replace("\n", " ")


def md_table(df: pd.DataFrame) -> str:
    if df is None or df.empty:
        return "(none)\n"
    lines = ["| " + " | ".join(_md_cell(c) for c in df.columns) + " |",
             "|" + "|".join("---" for _ in df.columns) + "|"]
    lines += ["| " + " | ".join(_md_cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def html_table(df: pd.DataFrame) -> str:
    if df is None or df.empty:
        return "<p>(none)</p>"
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    body = []
    for row in df.itertuples(index=False):
        sat = any(str(v).startswith(SAT_MARK) for v in row)
        cls = ' class="sat"' if sat else ""
        body.append(f"<tr{cls}>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _fmt_df(df: pd.DataFrame) -> pd.DataFrame:
    out = df.copy()
    for c in out.columns:
        if pd.api.types.is_float_dtype(out[c]):
            out[c] = out[c].map(lambda v: _fmt(v, ".4g"))
    return out


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1150px;margin:2em auto;padding:0 1em;color:#222}
h1{font-size:1.6em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;font-size:.82em;margin:.6em 0}td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}
th{background:#f3f3f3}tr.sat td{background:#fff1ef}
figure{margin:1em 0}figure img{max-width:100%;height:auto;border:1px solid #eee}figcaption{font-size:.9em;color:#444}
p.headline{font-size:1.05em;background:#f5f8ff;border-left:4px solid #1f77b4;padding:.4em .8em}
.meta{color:#666;font-size:.85em}
"""


def render(blocks: list[tuple], title: str, out_dir: Path) -> tuple[str, str]:
    """Blocks -> (markdown, self-contained html).  Figures: md links plots/, html embeds the PNG."""
    md = [f"# {title}\n"]
    hb = [f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
          f"<style>{CSS}</style></head><body><h1>{html.escape(title)}</h1>"]
    for b in blocks:
        kind = b[0]
        if kind == "h2":
            md.append(f"\n## {b[1]}\n")
            hb.append(f"<h2>{html.escape(b[1])}</h2>")
        elif kind in ("p", "headline", "meta"):
            md.append(f"{'**' if kind == 'headline' else ''}{b[1]}{'**' if kind == 'headline' else ''}\n")
            cls = f" class='{kind}'" if kind != "p" else ""
            hb.append(f"<p{cls}>{html.escape(b[1])}</p>")
        elif kind == "list":
            md.append("\n".join(f"- {x}" for x in b[1]) + "\n")
            hb.append("<ul>" + "".join(f"<li>{html.escape(x)}</li>" for x in b[1]) + "</ul>")
        elif kind == "table":
            md.append(md_table(b[1]))
            hb.append(html_table(b[1]))
        elif kind == "fig":
            fig: SavedFigure = b[1]
            png = next(p for p in fig.paths if p.suffix == ".png")
            rel = png.relative_to(out_dir).as_posix()
            svg = [p for p in fig.paths if p.suffix == ".svg"]
            svg_txt = f" ([SVG]({svg[0].relative_to(out_dir).as_posix()}))" if svg else ""
            md.append(f"![{fig.caption}]({rel})\n\n*{fig.caption}*{svg_txt}\n")
            data = base64.b64encode(png.read_bytes()).decode("ascii")
            hb.append(f"<figure id='{fig.stem}'><img alt='{html.escape(fig.caption, quote=True)}' "
                      f"src='data:image/png;base64,{data}'><figcaption>{html.escape(fig.caption)}</figcaption></figure>")
    hb.append("</body></html>\n")
    return "\n".join(md), "".join(hb)


def _meta_line(s: StudyResults) -> str:
    m, c = s.manifest, s.config
    ds = c.get("dataset") or {}
    return (f"Run {s.path.name}: device {m.get('device', '?')}, vLLM {m.get('vllm_version', '?')}, "
            f"torch {m.get('torch_version', '?')}, prefixstudy {m.get('prefixstudy_version', '?')}; "
            f"model {c.get('model', '?')}, TP={(c.get('engine') or {}).get('tensor_parallel_size', 1)}; "
            f"dataset prefix {ds.get('prefix_len', '?')} + suffix {ds.get('suffix_len', '?')} tokens, "
            f"output {ds.get('output_len', '?')} tokens, {ds.get('groups', '?')} prefix group(s); "
            f"status {m.get('status', '?')}; {m.get('started_at', '?')} – {m.get('ended_at', '?')}.")


def report_blocks(d: ReportData, figs: list[SavedFigure], model: tuple[list[str], pd.DataFrame | None]) -> list[tuple]:
    f = {x.stem: x for x in figs}
    b: list[tuple] = [("meta", _meta_line(d.study))]
    b += [("headline", t) for t in headline_paragraphs(d)]
    if d.slo:
        b.append(("p", "SLOs (ms): " + ", ".join(f"{k} ≤ {v:g}" for k, v in d.slo.items())
                  + ". Goodput = counted requests meeting every SLO / point duration (summary.csv's duration_s)."))
    b += [("h2", "Points"),
          ("p", f"Every point of the run. {SAT_MARK} marks a saturated point in every table; "
                "an X marks one in every figure."),
          ("table", all_points_table(d)),
          ("table", points_table(d)),
          ("h2", "Latency vs load"), ("fig", f["e2e_vs_rate"]), ("fig", f["ttft_vs_rate"]),
          ("h2", "Where the time goes"), ("fig", f["latency_breakdown"]),
          ("h2", "Highest rate meeting a latency threshold"), ("fig", f["max_rate_vs_threshold"]),
          ("h2", "Caching gain"),
          ("p", "Gain = (OFF − ON) / OFF of the mean over counted requests; 95 % CI from 1000 seeded bootstrap "
                "resamples of each mode independently. Paired Δ = OFF − ON of the same request_index "
                "(the same scheduled request) at the same rate; > 0 means ON was faster."),
          ("fig", f["caching_gain"]), ("table", gain_table(d)),
          ("h2", "Prefill share"), ("p", ESTIMATOR_TEXT), ("table", fit_table(d)),
          ("fig", f["prefill_share"]), ("table", prefill_table(d)),
          ("h2", "Engine time series"), ("fig", f["engine_timeseries"]),
          ("h2", "Latency distributions"), ("fig", f["e2e_cdf"]),
          ("h2", "Definitions"), ("p", SATURATION_TEXT),
          ("p", "Counted requests: warmup == False and error == \"\". Percentiles: linear interpolation.")]
    texts, df = model
    if texts or df is not None:
        b.append(("h2", "Model vs measurement"))
        b += [("p", t) for t in texts]
        if df is not None:
            b.append(("table", _fmt_df(df)))
    if d.notes:
        b += [("h2", "Notes"), ("list", d.notes)]
    return b


def build_report(results_dir: str | Path, slo: dict[str, float] | str | None = None,
                 threshold_ms: float | None = None, peers: Sequence[str | Path] = (),
                 point: str | tuple[str | None, float] | None = None, *, n_boot: int = 1000,
                 seed: int = 0, formats: Sequence[str] = FORMATS) -> Path:
    """Write report.md, report.html and plots/ into the run folder.  Returns report.html's path.

    ``slo``: dict (ms) or text "ttft=200,e2e=2000".  ``threshold_ms``: the p90 E2E threshold
    of the headline (default: the e2e SLO, else 2 × OFF's p90 E2E at the lowest rate).
    ``peers``: vllm-bench-serve JSON files overlaid on figures 1 and 2.  ``point``: the
    rate (optionally "MODE RATE") of the engine time series.
    """
    from prefixstudy.report import bench_json as exchange

    study = load(results_dir)
    slo = stats.parse_slo(slo) if isinstance(slo, str) or slo is None else dict(slo)
    point = parse_point(point) if isinstance(point, str) or point is None else point
    if study.requests.empty:
        raise UserError(f"{study.path}: no requests recorded yet; nothing to report")
    peer_df = exchange.peer_points(list(peers)) if peers else None
    d = analyze(study, slo, threshold_ms, n_boot=n_boot, seed=seed)
    figs = draw_figures(d, study.path, peer_df, point, formats)
    blocks = report_blocks(d, figs, model_section(d))
    if peers:
        blocks.insert(1, ("p", "Peer measurements overlaid on figures 1 and 2: "
                          + ", ".join(str(p) for p in peers) + "."))
    md, page = render(blocks, f"Prefix caching study: {d.label}", study.path)
    atomic_write_text(study.path / REPORT_MD, md)
    atomic_write_text(study.path / REPORT_HTML, page)
    return study.path / REPORT_HTML


# ----------------------------------------------------------------- compare

def build_compare(results_dirs: Sequence[str | Path], out_dir: str | Path,
                  slo: dict[str, float] | str | None = None, threshold_ms: float | None = None, *,
                  n_boot: int = 1000, seed: int = 0, formats: Sequence[str] = FORMATS) -> Path:
    """Overlay several studies (labelled study / device / TP) in one report in ``out_dir``."""
    if len(results_dirs) < 2:
        raise UserError("compare needs at least two results folders")
    slo = stats.parse_slo(slo) if isinstance(slo, str) or slo is None else dict(slo)
    out_dir = Path(out_dir)
    datas: list[ReportData] = []
    for rd in results_dirs:
        s = load(rd)
        if s.requests.empty:
            raise UserError(f"{s.path}: no requests recorded; nothing to compare")
        datas.append(analyze(s, slo, threshold_ms, n_boot=n_boot, seed=seed))
    labels = [d.label for d in datas]
    for i, d in enumerate(datas):  # same label twice: tell them apart by run id
        if labels.count(d.label) > 1:
            labels[i] = f"{d.label} ({d.study.path.name})"
    pts = {lab: d.points[d.points["status"] != "failed"] for lab, d in zip(labels, datas)}
    gains = {}
    for lab, d in zip(labels, datas):
        sat = d.points.groupby("rate")["saturated"].any().rename("saturated").reset_index()
        gains[lab] = d.gains.merge(sat, on="rate", how="left")
    curves = {}
    for metric, title in (("p90_e2e_ms", "p90 E2E"), ("p90_ttft_ms", "p90 TTFT")):
        th = _thresholds(pd.concat([p[metric] for p in pts.values()]))
        curves[title] = {lab: stats.max_rate_curve(p, metric, th) for lab, p in pts.items()}
    pd_ = out_dir / PLOTS_DIR
    specs = [
        ("compare_e2e", lambda: plots.compare_latency(pts, "e2e"), "Mean and p90 E2E vs offered rate."),
        ("compare_ttft", lambda: plots.compare_latency(pts, "ttft"), "Mean and p90 TTFT vs offered rate."),
        ("compare_gain", lambda: plots.compare_gain(gains), "Caching gain with 95 % bootstrap CIs."),
        ("compare_max_rate_e2e", lambda: plots.compare_max_rate(curves["p90 E2E"], "p90 E2E"),
         "Highest rate meeting a p90 E2E threshold."),
        ("compare_max_rate_ttft", lambda: plots.compare_max_rate(curves["p90 TTFT"], "p90 TTFT"),
         "Highest rate meeting a p90 TTFT threshold."),
    ]
    figs = [SavedFigure(stem, cap, plots.save(make(), pd_ / stem, formats)) for stem, make, cap in specs]
    rows = []
    for lab, d in zip(labels, datas):
        h = d.headline
        rows.append({"study": lab, "run": str(d.study.path), "vLLM": str(d.study.manifest.get("vllm_version", "?")),
                     "knee ON (req/s)": _rate(d.knees["on"]), "knee OFF (req/s)": _rate(d.knees["off"]),
                     "p90 E2E threshold (ms)": _fmt(h["threshold_ms"]),
                     "ON sustains (req/s)": _rate(h["sustains"]["on"]),
                     "OFF sustains (req/s)": _rate(h["sustains"]["off"])})
    blocks: list[tuple] = [("meta", f"Compared {len(datas)} studies on "
                            f"{_dt.datetime.now().astimezone().isoformat(timespec='seconds')}.")]
    for lab, d in zip(labels, datas):
        blocks.append(("h2", lab))
        blocks.append(("meta", _meta_line(d.study)))
        blocks += [("headline", t) for t in headline_paragraphs(d)]
    blocks += [("h2", "Side by side"), ("table", pd.DataFrame(rows)),
               ("p", "Line style and marker tell studies apart; colour is the mode (ON blue, OFF orange); "
                     "an X is a saturated point.")]
    blocks += [("fig", f) for f in figs]
    blocks += [("h2", "Definitions"), ("p", SATURATION_TEXT)]
    md, page = render(blocks, "Prefix caching studies compared", out_dir)
    atomic_write_text(out_dir / REPORT_MD, md)
    atomic_write_text(out_dir / REPORT_HTML, page)
    return out_dir / REPORT_HTML
