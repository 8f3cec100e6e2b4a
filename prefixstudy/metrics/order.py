"""Whether the order of the arms within a pair moved the result.

An interleaved run takes the arms in turns point by point, and each rate's repeats alternate which
arm goes first (``executors.run_plan.RunPlan.turns``), so at a rate with repeats both ways the gain of the
repeats where the baseline went first can be set beside the gain of those where the other arm did.
Which arm went first is read from the points' own start times (the manifest), not from the config:
a resumed or hand-merged run is judged by what it did.  Only rates where both arms kept up in every
repeat are compared: a saturated point's latency is a bound, and its gain too.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd


def first_arms(points: list[dict]) -> pd.DataFrame:
    """Per (rate, repeat) that more than one arm ran: the arm whose point started first."""
    rows = [{"mode": str(p["mode"]), "rate": float(p["rate"]), "repeat": int(p.get("repeat", 0)),
             "started_at": float(p["started_at"])} for p in points if p.get("started_at") is not None]
    if not rows:
        return pd.DataFrame(columns=["rate", "repeat", "first"])
    df = pd.DataFrame(rows).sort_values("started_at", kind="stable")
    g = df.groupby(["rate", "repeat"], sort=True)
    out = g["mode"].first().rename("first").reset_index()
    return out[g["mode"].nunique().to_numpy() > 1].reset_index(drop=True)


def order_effect(points: list[dict], summary: pd.DataFrame, arm: str, baseline: str) -> pd.DataFrame:
    """Per calm rate with repeats in both orders: the gain of mean E2E, 1 − arm / baseline, averaged
    over the repeats where ``baseline`` went first and over those where ``arm`` did, their difference
    in points, and each arm's mean E2E when it went first over when it went second (− 1)."""
    s = summary.assign(rate=summary["rate"].astype(float), mode=summary["mode"].astype(str))
    sat = s["saturated"].astype(str).str.lower().isin(["true", "1"])
    hot = set(s.loc[sat & s["mode"].isin([arm, baseline]), "rate"])
    e2e = s.pivot_table(index=["rate", "repeat"], columns="mode", values="mean_e2e_ms", aggfunc="first")
    if arm not in e2e or baseline not in e2e:
        return pd.DataFrame()
    firsts = first_arms(points).set_index(["rate", "repeat"])["first"]
    pairs = e2e[[arm, baseline]].join(firsts, how="inner").dropna()
    pairs = pairs[pairs["first"].isin([arm, baseline])].reset_index()
    pairs["gain"] = 1 - pairs[arm] / pairs[baseline]
    rows = []
    for rate, g in pairs.groupby("rate"):
        by = {who: g[g["first"] == who] for who in (baseline, arm)}
        if rate in hot or any(b.empty for b in by.values()):
            continue
        rows.append({"rate": rate, "n_baseline_first": len(by[baseline]), "n_arm_first": len(by[arm]),
                     "gain_baseline_first": float(by[baseline]["gain"].mean()),
                     "gain_arm_first": float(by[arm]["gain"].mean()),
                     "arm_first_over_second": _ratio(by[arm][arm], by[baseline][arm]),
                     "baseline_first_over_second": _ratio(by[baseline][baseline], by[arm][baseline])})
    out = pd.DataFrame(rows)
    if len(out):
        out["difference_points"] = 100 * (out["gain_arm_first"] - out["gain_baseline_first"])
    return out


def _ratio(first: pd.Series, second: pd.Series) -> float:
    return float(first.mean() / second.mean() - 1) if len(first) and len(second) else math.nan


def spread(effect: pd.DataFrame) -> tuple[float, float, float]:
    """The mean, smallest and largest difference in points over the compared rates (NaN: none)."""
    if effect.empty:
        return (math.nan,) * 3
    d = effect["difference_points"].to_numpy(float)
    return float(np.mean(d)), float(d.min()), float(d.max())
