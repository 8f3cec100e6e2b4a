"""What caching buys against the hit rate, at each load: one run per shared fraction of a fixed-length
prompt (``dataset.shared_fraction``), each with the same rates, arms and arrival schedule.

``gain_by_hit_rate`` makes one row per shared fraction x rate: the compared arm's measured hit rate
beside the one the workload implies (``workloads.fixed.expected_hit_rate``), the arm's gain over the
baseline in mean E2E with its interval (arms.csv: paired by request, t over repeats), and in
throughput, (arm - baseline) / baseline of output tokens per second, paired by repeat, with a
Student's t interval over the repeats (NaN with one repeat).

``pays_from`` reads it: at each rate, caching *pays* from the lowest hit rate at which the E2E
gain's interval lies above 0 there and at every higher hit rate measured at that rate.  A cell whose
measured hit rate is off the workload's by more than ``HIT_TOLERANCE`` (a cache that did not work,
a workload that did not split as asked) is flagged and left out of that reading.  Pure: frames in,
frames out."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from prefixstudy.shared.bootstrap import t_quantile

AXIS = "dataset.shared_fraction"
# Measured and expected hit rates differ by at most this much where the cache works: every measured
# request of a primed point hits the same whole blocks, so they agree exactly on echo and vLLM.
HIT_TOLERANCE = 0.02

HIT_RATE_FIELDS: dict[str, tuple[str, str]] = {
    "shared_fraction": ("float64", "the share of each prompt common to all requests (dataset.shared_fraction)"),
    "rate": ("float64", "offered request rate, req/s"),
    "arrival_rate": ("float64", "req/s, mean over repeats of the rate each schedule actually offered"),
    "arm": ("str", "the arm compared (the first arm of arms.csv; caching ON by default)"),
    "baseline": ("str", "the arm it is compared with (OFF by default)"),
    "n_repeats": ("int64", "repeats of the rate"),
    "hit_rate": ("float64", "the arm's measured hit rate: cached / prompt tokens of its counted requests"),
    "hit_rate_workload": ("float64", "floor(min(shared, L - 1) / B)·B / L: what the workload lets a warm cache serve "
                          "(block size B unknown: the runner's infinite-cache replay, arms.csv's hit_rate_expected)"),
    "hit_rate_ok": ("bool", f"measured within {HIT_TOLERANCE} of the workload's"),
    "gain_mean_e2e": ("float64", "(baseline - arm) / baseline of mean E2E, paired by request; 0.3: 30 % faster"),
    "gain_mean_e2e_lo": ("float64", "its 95 % interval (t over repeats, or one repeat's block bootstrap), lower end"),
    "gain_mean_e2e_hi": ("float64", "its upper end"),
    "gain_throughput": ("float64", "(arm - baseline) / baseline of output tokens per second, mean over repeats"),
    "gain_throughput_lo": ("float64", "its 95 % interval, Student's t over the repeats' paired gains, lower end; "
                           "NaN with one repeat"),
    "gain_throughput_hi": ("float64", "its upper end"),
    "gain_is_bound": ("bool", "either arm saturated here: the E2E gain is a bound, not a value"),
    "pays": ("bool", "the E2E gain's interval lies above 0 (gain_mean_e2e_lo > 0)"),
}
HIT_RATE_COLUMNS = list(HIT_RATE_FIELDS)


@dataclass(frozen=True)
class Cell:
    """One shared fraction's run: its arms.csv and summary.csv, and the hit rate its workload
    implies for a warm cache (NaN: unknown)."""

    arms: pd.DataFrame
    summary: pd.DataFrame
    hit_rate_workload: float


def throughput_gain(summary: pd.DataFrame, rate: float, arm: str, baseline: str) -> tuple[float, float, float, int]:
    """(gain, lo, hi, repeats paired) of ``arm``'s output tokens per second over ``baseline``'s at
    ``rate``, paired by repeat: the mean of the repeats' (arm - baseline) / baseline, Student's t
    over them (NaN interval with fewer than two)."""
    s = summary[summary["rate"] == rate]
    a = s[s["mode"] == arm].set_index("repeat")["output_tok_s"]
    b = s[s["mode"] == baseline].set_index("repeat")["output_tok_s"]
    both = a.index.intersection(b.index)
    g = ((a[both] - b[both]) / b[both]).to_numpy(float)
    g = g[np.isfinite(g)]
    if not g.size:
        return math.nan, math.nan, math.nan, 0
    est = float(g.mean())
    if g.size < 2:
        return est, math.nan, math.nan, 1
    half = t_quantile(0.975, g.size - 1) * float(g.std(ddof=1)) / math.sqrt(g.size)
    return est, est - half, est + half, int(g.size)


def gain_by_hit_rate(cells: Mapping[float, Cell]) -> pd.DataFrame:
    """One row per shared fraction x rate (HIT_RATE_COLUMNS), fractions then rates ascending."""
    rows = []
    for fraction in sorted(cells):
        c = cells[fraction]
        if c.arms.empty:
            continue
        arm, baseline = str(c.arms["arm"].iloc[0]), str(c.arms["baseline"].iloc[0])
        for _, r in c.arms[c.arms["arm"] == arm].sort_values("rate").iterrows():
            tput, tlo, thi, _ = throughput_gain(c.summary, float(r["rate"]), arm, baseline)
            hit = float(r["hit_rate"])
            # Where the block size or the split is unknown (a server that does not say), the runner's
            # infinite-cache replay of what was sent stands in.
            expected = c.hit_rate_workload if math.isfinite(c.hit_rate_workload) else float(r["hit_rate_expected"])
            rows.append({
                "shared_fraction": float(fraction), "rate": float(r["rate"]), "arrival_rate": float(r["arrival_rate"]),
                "arm": arm, "baseline": baseline, "n_repeats": int(r["n_repeats"]), "hit_rate": hit,
                "hit_rate_workload": expected, "hit_rate_ok": bool(abs(hit - expected) <= HIT_TOLERANCE),
                "gain_mean_e2e": float(r["gain_mean_e2e"]), "gain_mean_e2e_lo": float(r["gain_mean_e2e_lo"]),
                "gain_mean_e2e_hi": float(r["gain_mean_e2e_hi"]),
                "gain_throughput": tput, "gain_throughput_lo": tlo, "gain_throughput_hi": thi,
                "gain_is_bound": bool(r["gain_is_bound"]), "pays": bool(float(r["gain_mean_e2e_lo"]) > 0)})
    return pd.DataFrame(rows, columns=HIT_RATE_COLUMNS)


def pays_from(table: pd.DataFrame) -> pd.DataFrame:
    """Per rate: ``rate``, ``arrival_rate`` (mean over the fractions), ``pays_from_hit_rate`` (the
    lowest measured hit rate from which every higher one pays too; NaN: none does),
    ``top_hit_rate`` and the E2E and throughput gains there, and ``flagged`` (cells whose hit rate
    was off the workload's, left out)."""
    out = []
    for rate, g in table.groupby("rate", sort=True):
        ok = g[g["hit_rate_ok"]].sort_values("hit_rate")
        pays = ok["pays"].to_numpy(bool)
        # The lowest hit rate of the run of paying cells that reaches the top.
        k = len(pays)
        while k > 0 and pays[k - 1]:
            k -= 1
        top = ok.iloc[-1] if len(ok) else None
        out.append({"rate": float(rate), "arrival_rate": float(g["arrival_rate"].mean()),
                    "pays_from_hit_rate": float(ok["hit_rate"].iloc[k]) if k < len(pays) else math.nan,
                    "top_hit_rate": float(top["hit_rate"]) if top is not None else math.nan,
                    **{f"top_{c}": (float(top[c]) if top is not None else math.nan)
                       for c in ("gain_mean_e2e", "gain_mean_e2e_lo", "gain_mean_e2e_hi", "gain_throughput",
                                 "gain_throughput_lo", "gain_throughput_hi")},
                    "flagged": int((~g["hit_rate_ok"]).sum())})
    return pd.DataFrame(out)


def _pct(v: float) -> str:
    return "n/a" if not math.isfinite(v) else f"{100 * v:.1f} %"


def _interval(v: float, lo: float, hi: float) -> str:
    if not math.isfinite(lo):
        return f"{_pct(v)} (one repeat: no interval)"
    return f"{_pct(v)} [{100 * lo:.1f}, {100 * hi:.1f}]"


def pays_sentence(pays: pd.DataFrame) -> str:
    """The first screen's sentence: at what hit rate caching starts to pay, at each rate."""
    parts = []
    for _, p in pays.iterrows():
        at = f"{p['arrival_rate']:.3g} req/s"
        if math.isfinite(p["pays_from_hit_rate"]):
            parts.append(f"at hit rate {p['pays_from_hit_rate']:.3f} at {at}")
        else:
            parts.append(f"at no hit rate measured at {at} (up to {p['top_hit_rate']:.3f})")
    return ("Caching starts to pay (the mean-E2E gain's 95 % interval above 0, there and at every higher hit "
            "rate) " + "; ".join(parts) + "." if parts else "No shared-fraction cell has a result.")


def top_sentences(pays: pd.DataFrame) -> list[str]:
    """What the highest hit rate buys at each rate, in E2E and in throughput."""
    return [f"At {p['arrival_rate']:.3g} req/s and hit rate {p['top_hit_rate']:.3f}: mean E2E "
            f"{_interval(p['top_gain_mean_e2e'], p['top_gain_mean_e2e_lo'], p['top_gain_mean_e2e_hi'])} lower, "
            f"throughput {_interval(p['top_gain_throughput'], p['top_gain_throughput_lo'], p['top_gain_throughput_hi'])}"
            " higher." + (f" {int(p['flagged'])} cell(s) left out: hit rate off the workload's." if p["flagged"] else "")
            for _, p in pays.iterrows()]
