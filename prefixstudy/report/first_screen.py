"""Stage: report (first screen).  What a reader sees before scrolling: headline.csv as a table, the
"why" in two sentences computed from it, and E2E against the actual arrival rate with intervals.

Conventions: ≥ / ≤ before a number mark a bound (a saturated mode's latency grows with how long
the point ran, so a gain measured there is a bound), ⚠ a gain where both modes saturated, which
bounds nothing; intervals are 95 % (see metrics.headline).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from prefixstudy.report.figures import MODE_COLORS, MODE_LABELS, new_figure
from prefixstudy.report.tables import bound_mark, fmt, pct


def _ci(v, lo, hi, spec=".0f", scale=1.0, unit="") -> str:
    if not (isinstance(v, float) and math.isfinite(v)):
        return "–"
    return f"{fmt(v * scale, spec)}{unit} [{fmt(lo * scale, spec)}, {fmt(hi * scale, spec)}]"


def _bound(h: pd.Series) -> str:
    """ON's gain over OFF at a saturated point (tables.bound_mark: ON the arm, OFF the baseline)."""
    return bound_mark(bool(h["on_saturated"]), bool(h["off_saturated"])) if h["gain_is_bound"] else ""


def headline_table(head: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for _, h in head.sort_values("arrival_rate").iterrows():
        sat = [m.upper() for m in ("on", "off") if h[f"{m}_saturated"]]
        rows.append({
            "rate (req/s): actual (set)": f"{fmt(h['arrival_rate'], '.2f')} ({h['rate']:g})",
            "repeats": str(int(h["n_repeats"])),
            "ON mean E2E (ms)": _ci(h["on_mean_e2e_ms"], h["on_mean_e2e_lo"], h["on_mean_e2e_hi"]),
            "OFF mean E2E (ms)": _ci(h["off_mean_e2e_ms"], h["off_mean_e2e_lo"], h["off_mean_e2e_hi"]),
            "ON / OFF p90 E2E (ms)": f"{fmt(h['on_p90_e2e_ms'], '.0f')} / {fmt(h['off_p90_e2e_ms'], '.0f')}",
            "gain, mean E2E": _bound(h) + _ci(h["gain_mean_e2e"], h["gain_mean_e2e_lo"], h["gain_mean_e2e_hi"],
                                              spec=".1f", scale=100, unit=" %"),
            "engine prefill share ON / OFF": f"{pct(h['on_engine_prefill_share'])} / "
                                             + _ci(h["off_engine_prefill_share"], h["off_engine_prefill_share_lo"],
                                                   h["off_engine_prefill_share_hi"], scale=100, unit=" %"),
            "OFF decode slowdown": _ci(h["off_decode_slowdown"], h["off_decode_slowdown_lo"],
                                       h["off_decode_slowdown_hi"], spec=".2f", unit="×"),
            "hit rate ON (expected)": f"{fmt(h['on_hit_rate'], '.3f')} ({fmt(h['on_hit_rate_expected'], '.3f')})",
            "TPOT ON / OFF (ms)": f"{fmt(h['on_mean_tpot_ms'], '.2f')} / {fmt(h['off_mean_tpot_ms'], '.2f')}",
            "run-to-run spread ON / OFF": f"{fmt(h['on_spread_pct'], '.1f')} / {fmt(h['off_spread_pct'], '.1f')} %",
            "saturated": ", ".join(sat) or "no",
        })
    return pd.DataFrame(rows)


def why_sentences(head: pd.DataFrame) -> list[str]:
    """The study's answer in two sentences, every number from headline.csv."""
    h = head.sort_values("arrival_rate")
    h = h[h["gain_mean_e2e"].notna()]  # rates where both modes were measured
    if h.empty:
        return []
    lo = h.iloc[0]
    both = h[~h["on_saturated"] & ~h["off_saturated"]]
    hi = both.iloc[-1] if len(both) else h.iloc[-1]
    saved = lo["off_mean_e2e_ms"] - lo["on_mean_e2e_ms"]
    share_lo, share_hi, slow_hi = (lo["off_engine_prefill_share"], hi["off_engine_prefill_share"],
                                   hi["off_decode_slowdown"])
    first = (f"At {lo['arrival_rate']:.2f} req/s caching saves {saved:.0f} ms of {lo['off_mean_e2e_ms']:.0f} ms "
             f"(gain {_ci(lo['gain_mean_e2e'], lo['gain_mean_e2e_lo'], lo['gain_mean_e2e_hi'], '.1f', 100, ' %')})"
             + (f", about one prefill: prompts take only {pct(share_lo)} of OFF's busy engine time."
                if math.isfinite(share_lo) else "."))
    where = 'the highest rate where neither mode saturated' if len(both) else 'the highest rate'
    engine = ""
    if math.isfinite(share_hi) and math.isfinite(slow_hi):
        engine = (f"prompts take {pct(share_hi)} of OFF's engine time and every decode step is "
                  f"{fmt(slow_hi, '.2f')}× as long as it would be without the prefills it carries, so ")
    second = (f"At {hi['arrival_rate']:.2f} req/s, {where}, {engine}caching cuts mean E2E by {_bound(hi)}"
              f"{_ci(hi['gain_mean_e2e'], hi['gain_mean_e2e_lo'], hi['gain_mean_e2e_hi'], '.1f', 100, ' %')}.")
    if not engine:
        second += " This backend records no engine steps, so there is no engine-level prefill share."
    return [first, second]


def e2e_with_intervals(head: pd.DataFrame) -> Figure:
    """Mean E2E (solid, 95 % interval as bars) and p90 (dashed) vs the actual arrival rate, log y so
    low load stays readable; a hollow marker is a saturated rate (a lower bound on its latency)."""
    fig = new_figure()
    ax = fig.add_subplot()
    h = head.sort_values("arrival_rate")
    x = h["arrival_rate"].to_numpy(float)
    for mode in ("on", "off"):
        c = MODE_COLORS[mode]
        y = h[f"{mode}_mean_e2e_ms"].to_numpy(float)
        err = np.vstack([y - h[f"{mode}_mean_e2e_lo"].to_numpy(float), h[f"{mode}_mean_e2e_hi"].to_numpy(float) - y])
        sat = h[f"{mode}_saturated"].to_numpy(bool)
        ax.errorbar(x, y, yerr=np.clip(err, 0, None), color=c, capsize=3, lw=1.5, label=f"{MODE_LABELS[mode]} mean")
        ax.plot(x[~sat], y[~sat], "o", color=c, ms=5)
        ax.plot(x[sat], y[sat], "o", mfc="white", mec=c, ms=8, mew=1.5)
        ax.plot(x, h[f"{mode}_p90_e2e_ms"], "--", color=c, lw=1, label=f"{MODE_LABELS[mode]} p90")
    ax.plot([], [], "o", mfc="white", mec="black", label="saturated (a bound)")
    ax.set_yscale("log")
    ax.set_xlabel("actual arrival rate (req/s), mean over repeats")
    ax.set_ylabel("E2E latency (ms), log scale")
    ax.set_title("End-to-end latency vs load, 95 % intervals over repeats (this machine)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return fig
