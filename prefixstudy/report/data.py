"""Stage: report (data).  One study in, everything the report shows out: no drawing, no files.

The per-point numbers are summary.csv's (``summary_points``), never recomputed; what the
report adds is what summary.csv does not hold: the step-time fit and the engine-level
prefill share, the caching gain and paired differences, goodput for an SLO, knee rates,
the headline threshold and the max-rate curves, all from ``prefixstudy.metrics``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from prefixstudy.errors import UserError
from prefixstudy.metrics import compare, engine_fit, requests as reqs, summary
from prefixstudy.results import StudyResults
from prefixstudy.schema import MODES, SUMMARY_COLUMNS

KEY = ["mode", "rate"]
TEXT_COLUMNS = {"status": "ok", "error": "", "saturation_reason": ""}  # blank when summary.csv lacks them


@dataclass
class ReportData:
    """Everything the report shows for one study; no figures, no files."""

    study: StudyResults
    label: str
    points: pd.DataFrame  # summary.csv, one row per point, plus prefill_share_engine (and goodput with an SLO)
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

    @property
    def done(self) -> pd.DataFrame:
        """The points that finished (not failed)."""
        return self.points[self.points["status"] != "failed"]


def norm_rate(df: pd.DataFrame) -> pd.DataFrame:
    """Rates rounded to 1e-9, so points read from CSV and parquet match."""
    if "rate" in df:
        df = df.copy()
        df["rate"] = df["rate"].astype(float).round(9)
    return df


def _as_bool(v) -> bool:
    """summary.csv's saturated field: bool, 'True'/'False' text; empty means not saturated."""
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    return str(v).strip().lower() in ("true", "1", "yes")


def summary_points(study: StudyResults) -> pd.DataFrame:
    """summary.csv as the report reads it: one row per (mode, rate), saturated as bool.

    A column an older summary.csv lacks is blank (NaN, or "" for text); nothing is recomputed.
    """
    if not len(study.summary):
        raise UserError(f"{study.path}: summary.csv is missing or empty; no point was summarized")
    p = norm_rate(study.summary).drop_duplicates(KEY, keep="last")
    for c in SUMMARY_COLUMNS:
        if c not in p and c not in TEXT_COLUMNS:
            p[c] = math.nan
    for c, blank in TEXT_COLUMNS.items():
        p[c] = p[c].astype(object).where(p[c].notna(), blank).astype(str) if c in p else blank
    p["saturated"] = p["saturated"].map(_as_bool).astype(bool)
    return p.sort_values(KEY).reset_index(drop=True)


def manifest_points(study: StudyResults, points: pd.DataFrame) -> pd.DataFrame:
    rows = [{"mode": str(p.get("mode", "")), "rate": float(p.get("rate", math.nan)),
             "status": str(p.get("status", "")), "error": str(p.get("error") or "")}
            for p in study.manifest.get("points", []) or [] if isinstance(p, dict)]
    mp = norm_rate(pd.DataFrame(rows, columns=["mode", "rate", "status", "error"]))
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


def thresholds(values) -> np.ndarray:
    """The thresholds of a max-rate curve: every measured value, plus one below and one above."""
    v = np.asarray(values, dtype=float)
    v = np.unique(v[np.isfinite(v) & (v > 0)])
    if not v.size:
        return v
    return np.unique(np.concatenate([[v.min() * 0.7], v, [v.max() * 1.5]]))


def max_rate_curves(done: pd.DataFrame) -> dict[str, pd.DataFrame]:
    return {title: summary.max_rate_curve(done, metric, thresholds(done[metric]))
            for metric, title in (("p90_e2e_ms", "p90 E2E"), ("p90_ttft_ms", "p90 TTFT"))}


def step_fit(iterations: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Pooled then per-mode step-time fits, and a note when the pooled one is poor or undetermined."""
    if not len(iterations):
        return pd.DataFrame(), []
    fit = pd.concat([engine_fit.fit_step_cost(iterations), engine_fit.fit_step_cost(iterations, by="mode")],
                    ignore_index=True)
    pooled = fit.iloc[0]
    coef = pooled[["a_ms", "b_ms_per_prompt_token", "c_ms_per_gen_token"]].astype(float)
    if not np.isfinite(coef).all():
        return fit, ["The step-time fit is undetermined (too few busy iterations, or prompt and generated "
                     "token counts that do not vary independently); no engine-level prefill share."]
    if pooled["r2"] < 0.5 or (coef < 0).any():
        return fit, [f"The pooled step-time fit is poor (R² = {pooled['r2']:.2f}"
                     + (", a negative coefficient" if (coef < 0).any() else "")
                     + "); read the engine-level prefill share as rough."]
    return fit, []


def gains_and_pairs(requests: pd.DataFrame, n_boot: int, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Caching gain of mean E2E and TTFT per rate, and the paired E2E (and TTFT) differences."""
    gains = pd.concat([compare.caching_gain(requests, "e2e_ms", n_boot=n_boot, seed=seed),
                       compare.caching_gain(requests, "ttft_ms", n_boot=n_boot, seed=seed + 1)], ignore_index=True)
    pe = compare.paired_summary(compare.paired_differences(requests, "e2e_ms"))
    pt = compare.paired_summary(compare.paired_differences(requests, "ttft_ms"))
    paired = pe.merge(pt[["rate", "mean_delta", "median_delta"]].rename(
        columns={"mean_delta": "mean_delta_ttft", "median_delta": "median_delta_ttft"}), on="rate", how="left")
    return gains, paired


def _with_extras(points: pd.DataFrame, requests: pd.DataFrame, iterations: pd.DataFrame,
                 slo: dict[str, float]) -> pd.DataFrame:
    """summary.csv plus the engine-level prefill share and, with an SLO, goodput over summary.csv's durations."""
    share = (engine_fit.engine_prefill_share(iterations) if len(iterations)
             else pd.DataFrame(columns=KEY + ["prefill_share_engine"]))
    points = points.merge(share[KEY + ["prefill_share_engine"]], on=KEY, how="left")
    if slo:
        gp = reqs.goodput(requests, slo, durations=points[KEY + ["duration_s"]])
        points = points.merge(gp[KEY + ["n_good", "goodput_rps"]], on=KEY, how="left")
    return points


def analyze(study: StudyResults, slo: dict[str, float] | None = None, threshold_ms: float | None = None,
            n_boot: int = 1000, seed: int = 0) -> ReportData:
    """Everything one report shows for ``study`` (see ReportData)."""
    slo = dict(slo or {})
    req, it = norm_rate(study.requests), norm_rate(study.iterations)
    points = _with_extras(summary_points(study), req, it, slo)
    done = points[points["status"] != "failed"]
    knees = {m: summary.knee_rate(done, m) for m in MODES}
    y, y_src = choose_threshold(done, slo, threshold_ms)
    headline = {"threshold_ms": y, "threshold_source": y_src, "knees": knees,
                "sustains": {m: summary.max_rate_meeting(done, "p90_e2e_ms", y, m) if math.isfinite(y)
                             else math.nan for m in MODES}}
    gains, paired = gains_and_pairs(req, n_boot, seed)
    fit, notes = step_fit(it)
    return ReportData(study, study_label(study), points, manifest_points(study, points), knees, fit, gains,
                      paired, slo, y, y_src, max_rate_curves(done), headline, notes)
