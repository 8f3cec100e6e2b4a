"""Stage: report (arms).  arms.csv in (every arm against the baseline arm, per rate), its first-screen
sentences, a table and one figure out; every number from arms.csv (metrics.headline.versus_baseline).

Shown when a study ran more arms than ON against OFF: for a two-arm study headline.csv says it all.
A gain where either arm saturated is a bound (≥ when only the baseline did, ≤ when the arm did;
⚠ where both did, and it bounds nothing).  An arm with a CPU tier also gets a verdict against the
same cache without the tier (``tier_sentences``): is the tier worth it here.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from prefixstudy.report.figure_kit import MODE_COLORS, MODE_LABELS, SAT_MARKER, SAT_SIZE, new_figure, rate_axis
from prefixstudy.report.tables import bound_mark, fmt


def shown(arms: pd.DataFrame) -> bool:
    """More to say than headline.csv: an arm other than ON, or a baseline other than OFF."""
    return len(arms) > 0 and bool(((arms["arm"] != "on") | (arms["baseline"] != "off")).any())


def gain_mark(r: pd.Series) -> str:
    """An arms.csv row's mark for its gain over the baseline (tables.bound_mark)."""
    return bound_mark(bool(r["saturated"]), bool(r["baseline_saturated"])) if r["gain_is_bound"] else ""


def _gain(r: pd.Series) -> str:
    g = r["gain_mean_e2e"]
    if not math.isfinite(g):
        return "–"
    return (f"{gain_mark(r)}{fmt(100 * g, '.1f')} % [{fmt(100 * r['gain_mean_e2e_lo'], '.1f')}, "
            f"{fmt(100 * r['gain_mean_e2e_hi'], '.1f')}]")


def _finite(r: pd.Series, col: str) -> bool:
    return col in r and r[col] is not None and math.isfinite(float(r[col]))


def _by_tier(r: pd.Series) -> str:
    """The engine's own split of the hit rate: GPU prefix cache + CPU tier ("–": it does not say)."""
    if not _finite(r, "hit_rate_gpu"):
        return "–"
    gpu = fmt(r["hit_rate_gpu"], ".3f")
    return f"{gpu} + {fmt(r['hit_rate_cpu'], '.3f')}" if _finite(r, "hit_rate_cpu") else gpu


def sentences(arms: pd.DataFrame) -> list[str]:
    """Per arm, at the highest rate where neither it nor the baseline saturated (else the highest):
    its mean E2E against the baseline's and the paired gain with its interval."""
    out = []
    for arm, grp in arms.groupby("arm", sort=False):
        g = grp.sort_values("rate")
        calm = g[~g["gain_is_bound"].astype(bool)]
        r = (calm if len(calm) else g).iloc[-1]
        base = r["baseline"]
        out.append(f"{MODE_LABELS[arm]} against {MODE_LABELS[base]} at {r['rate']:g} req/s set "
                   f"({fmt(r['arrival_rate'], '.2f')} actual): mean E2E {fmt(r['mean_e2e_ms'], '.1f')} ms vs "
                   f"{fmt(r['baseline_mean_e2e_ms'], '.1f')} ms, gain {_gain(r)} (paired over "
                   f"{int(r['n_pairs'])} requests, 95 % interval on this machine), hit rate {fmt(r['hit_rate'], '.3f')}"
                   + (f", {fmt(r['hit_rate_cpu'], '.3f')} of it from the CPU tier (the engine's count)"
                      if _finite(r, "hit_rate_cpu") else "") + ".")
    return out


# Below this share of the prompt tokens the tier served nothing worth a word.
TIER_SERVED_MIN = 0.005


def _at(r: pd.Series, cache: str) -> str:
    who = {(True, True): "both", (True, False): MODE_LABELS[r["arm"]], (False, True): MODE_LABELS[cache]}
    sat = who.get((bool(r["saturated"]), bool(r["baseline_saturated"])))
    why = f" ({sat} saturated in a repeat)" if sat else ""
    return f"{_gain(r)} at {fmt(r['arrival_rate'], '.2f')} req/s{why}"


def tier_sizes(config: dict | None) -> dict[str, float]:
    """Each offload arm's CPU tier in GiB, from the study's saved config."""
    return {a["name"]: float(a["offload"]["size_gib"]) for a in (config or {}).get("arms") or []
            if isinstance(a, dict) and isinstance(a.get("offload"), dict) and "size_gib" in a["offload"]}


def tier_sentences(tiers: pd.DataFrame, sizes_gib: dict[str, float] | None = None) -> list[str]:
    """Is a CPU tier worth it here: per arm with a tier, its paired gain in mean E2E over the same
    cache without the tier (metrics.headline.tiers_versus_cache), rate by rate, and a verdict: no
    where the tier served (almost) no prompt tokens, saying why; yes where the gain's interval lies
    above 0 at a rate where the arm kept up; it costs where the interval lies below 0 at a rate
    where neither saturated; else no measurable difference."""
    out = []
    for arm, grp in tiers.groupby("arm", sort=False):
        g = grp.sort_values("rate")
        cache = str(g["baseline"].iloc[0])
        kept_up = g[~g["saturated"].astype(bool)]
        calm = g[~g["gain_is_bound"].astype(bool)]
        served = float(np.nanmean(g["hit_rate_cpu"].to_numpy(float)))
        hit, expected = float(np.nanmean(g["hit_rate"].to_numpy(float))), float(np.nanmean(g["hit_rate_expected"]))
        if served < TIER_SERVED_MIN:
            verdict = "no: the tier served no prompt tokens, " + (
                "the GPU cache kept what came back" if hit >= expected - 0.01
                else "it is too small to hold what the GPU cache evicted before it came back")
        elif (kept_up["gain_mean_e2e_lo"] > 0).any():
            verdict = "yes"
        elif (calm["gain_mean_e2e_hi"] < 0).any():
            verdict = "no, it costs time"
        else:
            verdict = "no measurable difference"
        size = (sizes_gib or {}).get(arm)
        name = f"{MODE_LABELS[arm]}" + (f" ({size:g} GiB)" if size is not None else "")
        out.append(f"Is a CPU tier worth it here? {name}: {verdict}. Against {MODE_LABELS[cache]} alone (the same "
                   f"GPU cache, no tier), its gain in mean E2E is " + "; ".join(_at(r, cache) for _, r in g.iterrows())
                   + f" (paired by request, 95 % intervals on this machine); hit rate {fmt(hit, '.3f')} of "
                   f"{fmt(expected, '.3f')} possible, {fmt(served, '.3f')} from the CPU tier (the engine's count).")
    return out


def table(arms: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for _, r in arms.sort_values(["rate", "arm"], kind="stable").iterrows():
        rows.append({
            "rate (req/s): actual (set)": f"{fmt(r['arrival_rate'], '.2f')} ({r['rate']:g})",
            "arm": r["arm"], "baseline": r["baseline"],
            "mean E2E (ms)": f"{fmt(r['mean_e2e_ms'], '.0f')} [{fmt(r['mean_e2e_lo'], '.0f')}, "
                             f"{fmt(r['mean_e2e_hi'], '.0f')}]",
            "baseline mean E2E (ms)": fmt(r["baseline_mean_e2e_ms"], ".0f"),
            "gain, mean E2E": _gain(r),
            "hit rate (expected)": f"{fmt(r['hit_rate'], '.3f')} ({fmt(r['hit_rate_expected'], '.3f')})",
            "hit rate, engine: GPU + CPU tier": _by_tier(r),
            "saturated": ", ".join(w for w, s in (("arm", r["saturated"]), ("baseline", r["baseline_saturated"])) if s)
                         or "no",
        })
    return pd.DataFrame(rows)


def figure(arms: pd.DataFrame) -> Figure:
    """Left: each arm's mean E2E with its interval, and the baseline's (dashed); right: each arm's
    gain over the baseline with its paired interval; both against the actual arrival rate."""
    fig = new_figure(12.0, 4.8)
    left, right = fig.subplots(1, 2)
    for arm, grp in arms.groupby("arm", sort=False):
        g = grp.sort_values("arrival_rate")
        x, c = g["arrival_rate"].to_numpy(float), MODE_COLORS[arm]
        for ax, col, lo, hi in ((left, "mean_e2e_ms", "mean_e2e_lo", "mean_e2e_hi"),
                                (right, "gain_mean_e2e", "gain_mean_e2e_lo", "gain_mean_e2e_hi")):
            scale = 100.0 if ax is right else 1.0
            y = g[col].to_numpy(float) * scale
            err = np.vstack([y - g[lo].to_numpy(float) * scale, g[hi].to_numpy(float) * scale - y])
            ax.errorbar(x, y, yerr=np.clip(np.nan_to_num(err), 0, None), color=c, capsize=3, lw=1.5,
                        marker="o", ms=4, label=MODE_LABELS[arm])
            bound = g["gain_is_bound"].to_numpy(bool)
            ax.plot(x[bound], y[bound], ls="none", marker=SAT_MARKER, color=c, ms=SAT_SIZE,
                    markeredgecolor="black", markeredgewidth=0.8)
    for base, grp in arms.groupby("baseline", sort=False):
        g = grp.drop_duplicates("rate").sort_values("arrival_rate")
        left.plot(g["arrival_rate"], g["baseline_mean_e2e_ms"], "--", marker="s", ms=4, color=MODE_COLORS[base],
                  label=f"{MODE_LABELS[base]} (baseline)")
    right.axhline(0, color="black", lw=0.8)
    for ax in (left, right):
        rate_axis(ax, arms["arrival_rate"])
        ax.set_xlabel("actual arrival rate (req/s)")
        ax.legend(fontsize=8)
    e2e = arms[["mean_e2e_ms", "baseline_mean_e2e_ms"]].to_numpy(float)
    e2e = e2e[np.isfinite(e2e) & (e2e > 0)]
    if e2e.size and e2e.max() / e2e.min() >= 10:  # a sweep into saturation spans decades
        left.set_yscale("log")
    left.set_ylabel("mean E2E (ms), 95 % interval")
    right.set_ylabel("gain over the baseline, mean E2E (%)")
    left.set_title("Every arm's mean E2E (X: saturated, a bound)")
    right.set_title("(baseline − arm) / baseline, paired by request")
    return fig
