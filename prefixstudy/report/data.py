"""Stage: report (data).  One study in, everything the report shows out: no drawing, no files.

The per-point numbers are summary.csv's (``summary_points``, averaged over a rate's repeats) and
headline.csv's (per rate, with intervals), never recomputed; what the report adds is what those
do not hold: paired differences, goodput for an SLO, the max-rate curves, all from
``prefixstudy.metrics``.  Every rate is shown at the rate the schedule actually offered (the
mean ``arrival_rate`` of its repeats); ``nominal_rate`` keeps the configured one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from prefixstudy.config.arms import arm_label, compared
from prefixstudy.errors import UserError
from prefixstudy.metrics import compare, gain_split, headline as hl, requests as reqs, step_checks, summary
from prefixstudy.costmodel import engine_fit
from prefixstudy.results import StudyResults
from prefixstudy.results.finish import study_arms
from prefixstudy.schema import MODES, SUMMARY_COLUMNS, typed_iterations

KEY = ["mode", "rate"]
TEXT_COLUMNS = {"status": "ok", "error": "", "saturation_reason": ""}  # blank when summary.csv lacks them


@dataclass
class ReportData:
    """Everything the report shows for one study; no figures, no files."""

    study: StudyResults
    label: str
    points: pd.DataFrame  # summary.csv, one row per mode x rate (repeats averaged), plus goodput with an SLO
    manifest_points: pd.DataFrame  # mode, rate, status, error: every point the run knows of
    knees: dict[str, float]  # midpoint knee in actual arrival rate (metrics.headline.knee)
    fit: pd.DataFrame  # pooled fit, then per-mode fits
    gains: pd.DataFrame
    paired: pd.DataFrame
    slo: dict[str, float]
    threshold_ms: float
    threshold_source: str
    curves: dict[str, pd.DataFrame]
    headline: dict[str, Any]
    head: pd.DataFrame = field(default_factory=pd.DataFrame)  # headline.csv, x = actual arrival rate
    notes: list[str] = field(default_factory=list)
    repeat_saturated: dict = field(default_factory=dict)  # (mode, configured rate, repeat) -> saturated
    step_checks: dict | None = None  # metrics.step_checks.check_steps of the study's steps
    tiers: pd.DataFrame = field(default_factory=pd.DataFrame)  # arms with a CPU tier vs caching ON alone
    split: pd.DataFrame = field(default_factory=pd.DataFrame)  # metrics.gain_split.both per rate, actual rates
    coef: np.ndarray | None = None  # the step-cost fit's coefficients (engine_fit.COEF_NAMES); None: no fit
    arms: tuple[str, str] = MODES  # the arm headline.csv compares, and its baseline (arms.compared)

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
    """summary.csv as the report reads it: one row per (mode, rate), saturated as bool; a rate's
    repeats averaged (saturated if any repeat was; the reasons of each, tagged r0, r1, ...).

    A column an older summary.csv lacks is blank (NaN, or "" for text); nothing is recomputed.
    """
    if not len(study.summary):
        raise UserError(f"{study.path}: summary.csv is missing or empty; no point was summarized")
    p = norm_rate(study.summary)
    for c in SUMMARY_COLUMNS:
        if c not in p and c not in TEXT_COLUMNS:
            p[c] = math.nan
    for c, blank in TEXT_COLUMNS.items():
        p[c] = p[c].astype(object).where(p[c].notna(), blank).astype(str) if c in p else blank
    p["saturated"] = p["saturated"].map(_as_bool).astype(bool)
    p["saturation_reason"] = [f"r{int(k)}: {r}" if r and p["repeat"].max() > 0 else r
                              for k, r in zip(p["repeat"], p["saturation_reason"], strict=True)]
    num = [c for c in p.columns if c not in KEY + ["repeat"] and pd.api.types.is_numeric_dtype(p[c])
           and not pd.api.types.is_bool_dtype(p[c])]
    g = p.groupby(KEY, sort=True)
    out = g[num].mean()
    out["repeats"] = g["repeat"].nunique()
    out["saturated"] = g["saturated"].any()
    out["saturation_reason"] = g["saturation_reason"].agg(lambda s: "; ".join(x for x in s if x))
    out["status"] = g["status"].agg(lambda s: "failed" if (s == "failed").all() else "ok")
    out["error"] = g["error"].agg(lambda s: next((x for x in s if x), ""))
    out = out.reset_index()
    out["prefill_share_engine"] = out["engine_prefill_share"]
    return out.sort_values(KEY).reset_index(drop=True)


def manifest_points(study: StudyResults, points: pd.DataFrame) -> pd.DataFrame:
    rows = [{"mode": str(p.get("mode", "")), "rate": float(p.get("rate", math.nan)), "repeat": int(p.get("repeat", 0)),
             "status": str(p.get("status", "")), "error": str(p.get("error") or "")}
            for p in study.manifest.get("points", []) or [] if isinstance(p, dict)]
    mp = norm_rate(pd.DataFrame(rows, columns=["mode", "rate", "repeat", "status", "error"]))
    known = points[KEY + ["status", "error"]].assign(repeat=0)
    mp = pd.concat([mp, known[~known.set_index(KEY).index.isin(mp.set_index(KEY).index)]])
    return mp.sort_values(KEY).reset_index(drop=True)


def study_label(study: StudyResults) -> str:
    """'study / device / TP=n' from config and manifest."""
    cfg, man = study.config, study.manifest
    tp = (cfg.get("engine") or {}).get("tensor_parallel_size", 1)
    name = cfg.get("study") or study.path.parent.name or study.path.name
    return f"{name} / {man.get('device') or 'unknown device'} / TP={tp}"


def choose_threshold(points: pd.DataFrame, slo: dict[str, float], threshold_ms: float | None,
                     arms: tuple[str, str] = MODES) -> tuple[float, str]:
    """The p90 E2E threshold Y of the headline, and where it comes from: 2 x the baseline's p90 at
    its lowest rate (else the arm's) unless given."""
    if threshold_ms is not None:
        return float(threshold_ms), "given with --threshold"
    if "e2e" in slo:
        return float(slo["e2e"]), "the e2e SLO"
    for mode in arms[::-1]:
        p = points[(points["mode"] == mode) & points["p90_e2e_ms"].notna()].sort_values("rate")
        if len(p):
            r = p.iloc[0]
            return (2.0 * float(r["p90_e2e_ms"]),
                    f"2 × {arm_text(mode)}'s p90 E2E at its lowest rate "
                    f"({r['rate']:.2f} req/s: {r['p90_e2e_ms']:.1f} ms)")
    return math.nan, "no finished point"


def arm_text(arm: str) -> str:
    """An arm in the report's sentences: "caching ON" / "caching OFF" for the built-in ones."""
    return f"caching {arm_label(arm)}" if arm in MODES else f"arm {arm}"


def thresholds(values) -> np.ndarray:
    """The thresholds of a max-rate curve: every measured value, plus one below and one above."""
    v = np.asarray(values, dtype=float)
    v = np.unique(v[np.isfinite(v) & (v > 0)])
    if not v.size:
        return v
    return np.unique(np.concatenate([[v.min() * 0.7], v, [v.max() * 1.5]]))


def max_rate_curves(done: pd.DataFrame, compared: tuple[str, str] = MODES) -> dict[str, pd.DataFrame]:
    arms = list(dict.fromkeys([*compared, *done["mode"]]))
    return {title: summary.max_rate_curve(done, metric, thresholds(done[metric]), modes=arms)
            for metric, title in (("p90_e2e_ms", "p90 E2E"), ("p90_ttft_ms", "p90 TTFT"))}


def cold_start_notes(manifest: dict) -> list[str]:
    """What the cold-start probe (runner.cold) could not prove, from the points' ``cold_probe``:
    points whose reset did not take (failed), could not be verified, or had no reset.  Nothing for
    a run made before the probe, or where every caching point was proven cold."""
    probed = [p.get("cold_probe") for p in manifest.get("points", [])
              if p.get("cold_probe") not in (None, "caching off")]
    n, out = len(probed), []
    for status, text in (("warm", "failed: their prefix cache still held the probe after the reset or new salt "
                                  "(`--resume` runs them again)"),
                         ("unverified", "could not be proven cold: the probe saw no cache hits on this engine "
                                        "(cached tokens not reported?)"),
                         ("not reset", "ran without a reset (the server has no reset endpoint) and may have "
                                       "started warm; `sweep.cache_isolation: salt` isolates them"),
                         ("probe failed", "could not be probed: the probe request failed (`probe_error` in the "
                                          "manifest)")):
        k = probed.count(status)
        if k:
            out.append(f"Cold starts: {k} of {n} points of arms with a cache {text}.")
    return out


def step_fit(manifest: dict) -> tuple[pd.DataFrame, list[str]]:
    """The study's step-cost fit (recorded in the manifest by results.finish), and a note when it
    is poor or undetermined."""
    f = manifest.get("step_fit")
    timing = manifest.get("step_timing") or []
    if not f and "engine-async" in timing:
        return pd.DataFrame(), ["No step-cost fit, engine prefill share or decode slowdown, and no simulator "
                                "calibration from this run: its engine ran with async scheduling where no GPU "
                                "timer could be put (the GPU timer needs vLLM's in-process executor on one GPU), "
                                "and async scheduling overlaps each step's launch with the previous step's GPU "
                                "work, so the host-stamped step records are not per-step costs."]
    if not f:
        return pd.DataFrame(), ["No step-cost fit: too few engine steps (or a backend without steps); "
                                "no engine-level prefill share."]
    fit = pd.DataFrame([f])
    notes = []
    if "frontend" in timing:
        notes.append("This run's steps were timed at the frontend (before engine step timing): steps that "
                     "followed an idle spell were left out of the fit; read the engine columns as rough.")
    coef = np.array([f.get(k, 0.0) for k in engine_fit.COEF_NAMES], dtype=float)
    if f["r2"] < 0.5 or (coef < 0).any():
        notes.append(f"The step-cost fit is poor (R² = {f['r2']:.2f}"
                     + (", a negative coefficient" if (coef < 0).any() else "")
                     + "); read the engine-level prefill share as rough.")
    return fit, notes


def gains_and_pairs(requests: pd.DataFrame, n_boot: int, seed: int,
                    arms: tuple[str, str] = MODES) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The arm's gain over its baseline of mean E2E and TTFT per rate, and the paired E2E (and
    TTFT) differences."""
    gains = pd.concat([compare.caching_gain(requests, "e2e_ms", n_boot=n_boot, seed=seed, arms=arms),
                       compare.caching_gain(requests, "ttft_ms", n_boot=n_boot, seed=seed + 1, arms=arms)],
                      ignore_index=True)
    pe = compare.paired_summary(compare.paired_differences(requests, "e2e_ms", arms))
    pt = compare.paired_summary(compare.paired_differences(requests, "ttft_ms", arms))
    paired = pe.merge(pt[["rate", "mean_delta", "median_delta"]].rename(
        columns={"mean_delta": "mean_delta_ttft", "median_delta": "median_delta_ttft"}), on="rate", how="left")
    return gains, paired


def _with_extras(points: pd.DataFrame, requests: pd.DataFrame, iterations: pd.DataFrame,
                 slo: dict[str, float]) -> pd.DataFrame:
    """summary.csv plus, with an SLO, goodput over summary.csv's durations (repeats pooled)."""
    if slo:
        gp = reqs.goodput(requests, slo, durations=norm_rate(reqs.point_durations(requests)))
        gp = gp.groupby(KEY, as_index=False).agg(n_good=("n_good", "sum"), n_measured=("n_measured", "sum"),
                                                 duration_s=("duration_s", "sum"))
        gp["goodput_rps"] = np.where(gp["duration_s"] > 0, gp["n_good"] / gp["duration_s"], np.nan)
        points = points.merge(gp[KEY + ["n_good", "goodput_rps"]], on=KEY, how="left")
    return points


def gains_from_head(head: pd.DataFrame, ttft: pd.DataFrame) -> pd.DataFrame:
    """headline.csv's paired block-bootstrap E2E gains, plus the TTFT gains (independent resampling)."""
    e2e = pd.DataFrame({"rate": head["rate"], "metric": "e2e_ms", "gain": head["gain_mean_e2e"],
                        "ci_lo": head["gain_mean_e2e_lo"], "ci_hi": head["gain_mean_e2e_hi"],
                        "n_on": head["n_pairs"], "n_off": head["n_pairs"]})
    return pd.concat([e2e, ttft[ttft["metric"] == "ttft_ms"]], ignore_index=True)


def to_actual(df: pd.DataFrame, rate_map: dict[float, float]) -> pd.DataFrame:
    """``rate`` as the actual arrival rate, the configured one kept as ``nominal_rate``."""
    df = df.copy()
    df["nominal_rate"] = df["rate"]
    df["rate"] = [rate_map.get(float(r), float(r)) for r in df["rate"]]
    return df


def analyze(study: StudyResults, slo: dict[str, float] | None = None, threshold_ms: float | None = None,
            n_boot: int = 1000, seed: int = 0) -> ReportData:
    """Everything one report shows for ``study`` (see ReportData)."""
    slo = dict(slo or {})
    req, it = norm_rate(study.requests), norm_rate(study.iterations)
    head = norm_rate(study.headline)
    rate_map = {float(r): float(a) for r, a in zip(head.get("rate", []), head.get("arrival_rate", []), strict=False)
                if math.isfinite(a)}
    nominal = _with_extras(summary_points(study), req, it, slo)
    points = to_actual(nominal, rate_map)
    done = points[points["status"] != "failed"]
    arms = compared(*study_arms(study))
    knees = {m: hl.knee(head, m)[0] if f"{m}_saturated" in head else math.nan for m in arms}
    y, y_src = choose_threshold(done, slo, threshold_ms, arms)
    headline = {"threshold_ms": y, "threshold_source": y_src, "knees": knees,
                "sustains": {m: hl.rate_at_threshold(head, m, y) if math.isfinite(y) and f"{m}_saturated" in head
                             else (math.nan,) * 3 for m in arms}}
    gains, paired = gains_and_pairs(req, n_boot, seed, arms)
    gains = to_actual(gains_from_head(head, gains) if len(head) else gains, rate_map)
    fit, notes = step_fit(study.manifest)
    notes = notes + cold_start_notes(study.manifest)
    s = norm_rate(study.summary)
    rep_sat = {(str(m), float(r), int(k)): _as_bool(v)
               for m, r, k, v in zip(s["mode"], s["rate"], s.get("repeat", pd.Series(0, index=s.index)), s["saturated"],
                                     strict=True)}
    coef = engine_fit.recorded_coef(fit.iloc[0]) if len(fit) else None
    checks = step_checks.check_steps(typed_iterations(it), coef) if len(it) else None
    tiers = hl.tiers_versus_cache(req, s[s["status"] == "ok"], study.arms)
    split = pd.DataFrame()
    if coef is not None and (checks or {}).get("ok") is not False and set(arms) <= set(req["mode"]):
        split = gain_split.both(req, it, coef, *arms)[0]
        split = to_actual(split, rate_map) if len(split) else pd.DataFrame()
    return ReportData(study, study_label(study), points, to_actual(manifest_points(study, nominal), rate_map),
                      knees, fit, gains,
                      to_actual(paired, rate_map), slo, y, y_src, max_rate_curves(done, arms), headline, head, notes,
                      rep_sat, checks, tiers, split, coef, arms)

