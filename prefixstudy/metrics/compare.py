"""An arm against its baseline (caching ON vs OFF by default): the gain of the means with a seeded
bootstrap CI, and paired differences.  In the frames, ``on`` is the arm and ``off`` the baseline."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from prefixstudy.metrics.requests import counted, percentiles

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
                 ci: float = 0.95, seed: int = 0, arms: tuple[str, str] = ("on", "off")) -> pd.DataFrame:
    """Per rate: gain of the mean ``metric`` of ``arms[0]`` over the baseline ``arms[1]``, with a
    bootstrap CI.

    Columns: rate, metric, gain, ci_lo, ci_hi, n_on, n_off.  Each rate gets its own
    generator seeded by (seed, rate index), so adding a rate does not move the others.
    """
    ok = counted(requests)
    rows = []
    for i, rate in enumerate(sorted(ok["rate"].unique())):
        at = ok[ok["rate"] == rate]
        on = at.loc[at["mode"] == arms[0], metric].to_numpy(float)
        off = at.loc[at["mode"] == arms[1], metric].to_numpy(float)
        lo, hi = bootstrap_gain_ci(on, off, n_boot=n_boot, ci=ci, seed=_seed(seed, i))
        rows.append({"rate": float(rate), "metric": metric, "gain": gain(on, off),
                     "ci_lo": lo, "ci_hi": hi, "n_on": int(on.size), "n_off": int(off.size)})
    return pd.DataFrame(rows, columns=["rate", "metric", "gain", "ci_lo", "ci_hi", "n_on", "n_off"])


def _seed(seed: int, i: int) -> np.random.SeedSequence:
    return np.random.SeedSequence([int(seed), int(i)])


# ----------------------------------------------------------------- paired comparison

def paired_differences(requests: pd.DataFrame, metric: str = "e2e_ms",
                       arms: tuple[str, str] = ("on", "off")) -> pd.DataFrame:
    """Pair the arm ``arms[0]`` with its baseline ``arms[1]`` (ON with OFF by default) by (rate,
    request_index): the same scheduled request in both.

    Columns: rate, request_index, on (the arm), off (the baseline), delta (= off - on, so > 0
    means the arm is faster).
    Only pairs counted in both modes are kept.
    """
    ok = counted(requests)
    on = ok.loc[ok["mode"] == arms[0], ["rate", "request_index", metric]].rename(columns={metric: "on"})
    off = ok.loc[ok["mode"] == arms[1], ["rate", "request_index", metric]].rename(columns={metric: "off"})
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
